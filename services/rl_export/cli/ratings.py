"""``rl-export ratings``: Bradley-Terry ratings per agent version and agreement of comparisons
(docs/guides/agreement.md), over the latest records of the ``traces`` corpus that match the
filters, as one JSON object on stdout: ``{ratings: [{agent_version, rating, ci95: [lo, hi],
comparisons}], agreement: {pairs, percent, alpha}}``.

A pair counts when both its traces pass the filters (neither deleted); the votes are the
current ones each record's ``comparisons`` lists (:class:`~rl_export.labeling.ratings.
RatingsBuilder`). A bad flag, an unknown project or version is one line, exit 2.
"""

from __future__ import annotations

import argparse
import asyncio

from rl_export.cli.flags import _open, _pinned, _settings


def cmd_ratings(args: argparse.Namespace) -> int:
    from rl_export.cli.exports import _filter_values, no_traces_corpus
    from rl_export.export import latest_records, source_ref
    from rl_export.formats.filters import parse_filters
    from rl_export.labeling.ratings import RatingsBuilder, RatingsInput, ratings_report
    from rl_export.model.codec import dumps
    from rl_export.model.errors import NoDataError
    from rl_export.runtime.gctune import tune_gc

    settings = _settings(args, store_url="store")
    filters = parse_filters(_filter_values(args))
    ref = source_ref(args.org, args.project, "traces")
    version = _pinned(args, settings, ref)
    tune_gc()

    async def run() -> RatingsInput:
        store = _open(args.store, settings)
        builder = RatingsBuilder()
        try:
            async for batch in latest_records(
                store, ref, filters=filters, fields=RatingsBuilder.FIELDS,
                at=None if version is None else version.at,
            ):  # fmt: skip
                for record in batch:
                    builder.add(record)
        except NoDataError:  # its message names --source, which this command has not
            raise no_traces_corpus(ref.org, ref.project, store.url) from None
        finally:
            await store.close()
        return builder.build()

    print(dumps(ratings_report(asyncio.run(run())).model_dump(mode="json")).decode())
    return 0
