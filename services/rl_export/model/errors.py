"""Exceptions raised by rl-export.

Hierarchy::

    RlExportError                  base of everything the CLI turns into a one-line message
    ├── ConfigError                a setting is wrong; names the environment variable or flag
    │   ├── PartitionMismatchError topics exist with a partition count other than configured
    │   ├── TopicMismatchError     managed topics (RL_EXPORT_CREATE_TOPICS=false) are not as needed
    │   ├── KafkaSecurityError     the broker refused our TLS handshake or SASL authentication
    │   │   └── KafkaAccessError   the broker's ACLs refuse an operation (each one named)
    │   ├── FilterError            a filter (flag, query parameter, corpus spec) is malformed
    │   ├── ExportError            an export request cannot be met (format, source, column, ...)
    │   │   └── NoDataError        the org/project/corpus asked for has no data at all
    │   └── VersionError           a pinned version cannot be created, found or read
    ├── BrokerUnavailableError     Kafka cannot be reached at the configured bootstrap address
    ├── StoreError                 the object store failed or refused a request
    │   ├── ObjectExistsError      a create-only write lost: the object is already there
    │   ├── ObjectNotFoundError    a read asked for a key that is not there
    │   └── TableError             a corpus's open table (Delta Lake) could not be written or read
    └── LocalStackError            a local component (Kafka, SeaweedFS) could not be set up
"""

from __future__ import annotations


class RlExportError(Exception):
    """Base class: an error the command line reports as one line, without a traceback."""


class ConfigError(RlExportError):
    """A setting has a value that cannot work; the message names the setting."""

    def __init__(self, setting: str, detail: str) -> None:
        super().__init__(f"{setting}: {detail}")
        self.setting = setting
        self.detail = detail


class PartitionMismatchError(ConfigError):
    """Existing topics do not all have the configured partition count."""


class TopicMismatchError(ConfigError):
    """Topics we may not create are missing or not as the service needs them (every one listed)."""


class KafkaSecurityError(ConfigError):
    """TLS or SASL failed with the broker: fatal (retrying cannot help); names the setting."""


class KafkaAccessError(KafkaSecurityError):
    """The broker's ACLs do not let this process's principal do what it needs: fatal, and
    every missing operation is named with its resource (``grants``: what is missing)."""

    def __init__(self, setting: str, detail: str, grants: tuple[object, ...] = ()) -> None:
        super().__init__(setting, detail)
        self.grants = grants


class FilterError(ConfigError):
    """A filter is malformed; ``setting`` is the filter's name (``min-reward``)."""


class ExportError(ConfigError):
    """An export cannot be made as asked; ``setting`` names the parameter (``columns``)."""


class NoDataError(ExportError):
    """The corpus an export or stats asked for has no commit and no compaction."""


class VersionError(ConfigError):
    """A pinned corpus version cannot be created, found or read (``setting``: the flag or
    parameter, ``version`` by default)."""

    def __init__(self, detail: str, setting: str = "version") -> None:
        super().__init__(setting, detail)


class BrokerUnavailableError(RlExportError):
    """No Kafka broker answered at the bootstrap address."""


class StoreError(RlExportError):
    """The object store failed or refused a request."""


class ObjectExistsError(StoreError):
    """A create-only write found the key already present (another writer won)."""


class LocalStackError(RlExportError):
    """A local component (Kafka, SeaweedFS) could not be installed or started."""


class ObjectNotFoundError(StoreError):
    """A read asked for a key that does not exist."""


class TableError(StoreError):
    """A corpus's Delta Lake table (``_table/``) could not be written or read; the corpus's
    own objects are unaffected, and the next compaction tries the table again."""


class WorkerError(RlExportError):
    """A stage of the worker stopped on its own (the join process exited)."""
