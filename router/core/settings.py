"""The tunables both front doors and the workers read from one :class:`~router.config.RouterConfig`."""

from __future__ import annotations

from collections.abc import Hashable, Mapping

import attrs

from ..config import RouterConfig
from .layouts import EditSettings
from .policy import RetryPolicy
from .pseudonyms import Pseudonyms
from .writes import WriteSettings

__all__ = ["MAX_PAGE", "MAX_TYPES", "Settings"]

#: The largest page a single read returns.
MAX_PAGE = 1000
#: The most distinct types one ``read(..., types=...)`` may ask for.
MAX_TYPES = 100


@attrs.frozen
class Settings:
    """Writes, edits and reads, as the config sets them; ``timeout`` in seconds."""

    write: WriteSettings
    edit: EditSettings
    timeout: float
    max_pull: int = 1000
    #: The most periods one page asks (``read.max_periods``; None: every period in the window).
    max_periods: int | None = None
    pull_threshold: int | None = None
    #: Each cluster's deployment, as a number shared by the clusters on it (see :attr:`ClusterConfig.deployment`).
    deployments: Mapping[str, int] = attrs.field(factory=dict)
    #: How user ids become the pseudonyms erasure records hold (``erasure.key``). None turns off the writers' check
    #: of erasure records: only for measuring what that check costs (the benchmark); never in service.
    pseudonyms: Pseudonyms | None = attrs.field(factory=Pseudonyms, repr=False)

    @property
    def close_wait(self) -> float:
        """How long ``close()`` waits for the calls in flight (each bounded by ``timeout``), and the async door
        then for its clients to close: ``timeout`` plus 5 s."""
        return self.timeout + 5

    @classmethod
    def from_config(cls, config: RouterConfig) -> Settings:
        timeout = config.timeout.total_seconds()
        policy = RetryPolicy(attempts=config.write_retries + 1, backoff=config.retry_backoff.total_seconds())
        return cls(
            write=WriteSettings(batch_size=config.batch_size, policy=policy, timeout=timeout),
            edit=EditSettings(timeout=timeout, policy=policy),
            timeout=timeout,
            max_pull=config.max_pull,
            max_periods=config.max_periods,
            pull_threshold=config.pull_threshold,
            deployments=deployment_numbers(config),
            pseudonyms=pseudonyms_of(config),
        )


def pseudonyms_of(config: RouterConfig) -> Pseudonyms:
    """The pseudonyms of ``erasure.key`` (the public default key when it is not set)."""
    key = config.erasure_key
    return Pseudonyms(key.encode("utf-8", "surrogatepass")) if key else Pseudonyms()


def deployment_numbers(config: RouterConfig) -> dict[str, int]:
    """Each cluster's deployment as a number, the same for clusters on one deployment (no URI, no password)."""
    numbers: dict[Hashable, int] = {}
    return {c.name: numbers.setdefault(c.deployment, len(numbers)) for c in config.clusters}
