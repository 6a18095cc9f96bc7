"""Count XLA compilations through JAX's public ``jax.log_compiles`` (optax's no-recompilation recipe)."""

from __future__ import annotations

import contextlib
import logging

import jax


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__(level=logging.DEBUG)
        self.names: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("Compiling "):  # "Compiling jit(<name>) with global shapes and types ..."
            self.names.append(message.split(" ", 2)[1])


@contextlib.contextmanager
def compilations(fragment: str):
    """Yield the list of ``jit(...)`` names compiled inside the block whose name contains ``fragment``
    (e.g. ``"simulate"`` for ``batch.compiled(module.simulate)``); the list fills as the block runs."""
    handler, logger = _Collect(), logging.getLogger("jax")
    previous = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    matched: list[str] = []
    try:
        with jax.log_compiles():
            yield matched
            matched.extend(n for n in handler.names if fragment in n)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous)
