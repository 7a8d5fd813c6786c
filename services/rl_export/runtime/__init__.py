"""Process plumbing: settings, metrics, memory tuning, loopback ports, progress, store URLs.

The one settings class (:mod:`.settings`, every ``RL_EXPORT_`` variable), every Prometheus
metric (:mod:`.metrics`), the cycle collector's tuning (:mod:`.gctune`), loopback addresses
(:mod:`.net`), progress bars (:mod:`.progressbar`), store URLs (:mod:`.storeurl`) and a
pool's processes ending with their parent (:mod:`.orphans`).

Imports ``model``, ``privacy`` and ``formats`` (settings parse corpus specs and kinds).
"""
