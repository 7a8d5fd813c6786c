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

from rl_export.cli.flags import _open


def cmd_ratings(args: argparse.Namespace) -> int:
    from rl_export.cli.exports import TracesRecords
    from rl_export.labeling.ratings import RatingsBuilder, RatingsInput, ratings_report
    from rl_export.model.codec import dumps

    traces = TracesRecords(args)

    async def run() -> RatingsInput:
        store = _open(args.store, traces.settings)
        builder = RatingsBuilder()
        try:
            await traces.each(store, RatingsBuilder.FIELDS, builder.add)
        finally:
            await store.close()
        return builder.build()

    print(dumps(ratings_report(asyncio.run(run())).model_dump(mode="json")).decode())
    return 0
