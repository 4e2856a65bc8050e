"""The project's one error type: what went wrong (naming the file, option or value) and how to fix it.

The CLI prints an `Error` as one line and exits 2; anything else is a bug and keeps its traceback (exit 1).
Module errors (PipelineError, RFTError, CorpusError, ...) subclass it, so each module keeps its own name."""

from __future__ import annotations


class Error(Exception):
    """An expected failure: bad input, a damaged file, an output that cannot be written.

    `hint` says what to do about it (rerun with --overwrite, choose another --out, ...)."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message + (f"; {self.hint}" if self.hint else "")

    def one_line(self) -> str:
        return " ".join(str(self).split())


class InputError(Error, ValueError):
    """An input (file, folder, option value) that cannot be used as given."""


class OutputError(Error, OSError):
    """An output that cannot be written where asked (exists, under a file, read-only)."""


class OutputExistsError(OutputError, FileExistsError):
    """The output exists and --overwrite was not given."""


class MissingInputError(InputError, FileNotFoundError):
    """An input file or folder that does not exist."""


class UnknownNameError(InputError, KeyError):
    """A name (method, model family, corpus, adapter) that no registry knows; the message lists the known ones."""


class UnsupportedError(Error, NotImplementedError):
    """A valid request this code does not support for this model (the message says which and why)."""
