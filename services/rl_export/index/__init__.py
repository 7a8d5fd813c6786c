"""The query index: a read model of the corpora that the web service answers from.

The latest revision per trace of each followed corpus in DuckDB (:mod:`.queryindex`), its
SQL (:mod:`.sql`), the batches it takes (:mod:`.batches`), record bodies in local segment
files (:mod:`.segments`), who may write at once (:mod:`.gate`), the indexer that follows the
corpora (:mod:`.follower`), the team's queries over it (:mod:`.labelqueries`), answers kept
while their inputs hold (:mod:`.memo`), agreement reports kept warm (:mod:`.reports`) and the
pairs to compare (:mod:`.pairbook`).

Imports every stage below it (``corpora``, ``labeling``, ``export``) and the ground floor;
the web service imports it, it never imports ``web``.
"""
