from __future__ import annotations

import base64

from rl_export.local.broker import new_cluster_id


def test_cluster_ids_are_16_bytes_and_never_look_like_an_option() -> None:
    for _ in range(2000):  # about 1 in 64 raw ids starts with "-"
        cluster_id = new_cluster_id()
        assert not cluster_id.startswith("-")
        assert len(base64.urlsafe_b64decode(cluster_id + "==")) == 16
