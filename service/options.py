"""The sidecar's settings, with their one set of defaults: ``flywheel serve``'s flags read
them from here, and so do the server, the core, the batcher and the servicer.

No grpc here: the command line reads the defaults without importing the server.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from flywheel.classifier.settings.listen import check_port, split_address

__all__ = ["DEFAULT_ADDRESS", "BatchOptions", "ServerOptions"]

DEFAULT_ADDRESS = "127.0.0.1:50051"


@dataclass(frozen=True)
class BatchOptions:
    """Micro-batching and teacher-pool settings (``flywheel serve`` flags)."""

    max_batch: int = 32              # queries per encoder pass
    max_wait_ms: float = 2.0         # wait for more only while busy
    max_queue: int = 512             # queries waiting for the encoder; beyond: RESOURCE_EXHAUSTED
    teacher_workers: int = 4         # concurrent teacher calls
    teacher_queue: int = 16          # teacher calls admitted beyond the running ones
    min_teacher_s: float = 0.25      # less of the deadline left: answer without the teacher
    reply_margin_s: float = 0.05     # deadline kept for sending the reply


@dataclass(frozen=True)
class ServerOptions:
    """``flywheel serve``'s settings."""

    address: str = DEFAULT_ADDRESS
    uds: str | None = None                 # listen on this Unix domain socket instead
    grace_s: float = 10.0
    drain_s: float = 0.5                   # NOT_SERVING with the port open before it closes (within grace)
    max_message_bytes: int = 1 << 20
    admin_token: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    metrics_port: int | None = None        # None: no /metrics endpoint
    metrics_address: str = "127.0.0.1"
    max_workers: int = 128                 # gRPC handler threads (requests waiting on a batch hold one)
    teacher_check_s: float = 10.0          # the teacher's readiness is checked again this often
    batch: BatchOptions = field(default_factory=BatchOptions)

    def __post_init__(self) -> None:
        # a port outside 0-65535 is refused here, whoever built the options (a socket would
        # take it modulo 65536); whether the address can be listened on is the server's check
        if not self.uds:
            split_address(self.address, "--address")
        if self.metrics_port is not None:
            check_port(self.metrics_port, "--metrics-port")
