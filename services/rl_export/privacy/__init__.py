"""What traces may not carry out: redaction of free text and the attachment fetch policy.

Redaction (:mod:`.redact`: ``[REDACTED:KIND]`` in a row's strings, counts per kind) with its
detectors per kind (:mod:`.detectors`), and which attachment URIs an export may fetch
(:mod:`.attachment_sources`). Pure: no I/O.

Imports ``model`` only.
"""
