"""The data model: what events and records are, and how they are encoded.

Input events as pydantic models (:mod:`.events`) and the join's fast view of them
(:mod:`.eventview`), the trajectory record and its tombstone (:mod:`.records`), JSON and
JSON Lines encoding (:mod:`.codec`), the exception hierarchy (:mod:`.errors`) and which
partition a trace's events live on (:mod:`.partitioning`, the producers' key contract).

The ground floor: imports nothing of the package.
"""
