"""Progress bars of the project and of the libraries it drives (lm-eval, datasets): quiet off a terminal."""

from __future__ import annotations

import functools
import os
import sys

import tqdm.std as tqdm_std

# Off a terminal (make, Slurm and CI logs) every progress bar, lm-eval's and transformers' included, redraws at most
# every 30 s, and one that ends within 30 s writes nothing.
QUIET_PROGRESS_INTERVAL_S = 30.0


def quiet_progress_off_tty(stream=None) -> None:
    """Give every tqdm bar created from now on a 30 s default redraw interval and display delay when `stream`
    (stderr) is not a terminal. tqdm reads TQDM_* variables once, when it is imported, as a partialmethod over `tqdm.__init__`;
    this adds one more default the same way. Bars that pass mininterval, and a TQDM_MININTERVAL the user set,
    win; calling it twice changes nothing more."""
    stream = sys.stderr if stream is None else stream
    if (hasattr(stream, "isatty") and stream.isatty()) or "TQDM_MININTERVAL" in os.environ:
        return
    init = tqdm_std.tqdm.__dict__["__init__"]  # the partialmethod itself (attribute access unwraps it)
    if isinstance(init, functools.partialmethod) and init.keywords.get("mininterval") == QUIET_PROGRESS_INTERVAL_S:
        return
    # delay: a bar that ends within the interval (a checkpoint's "Loading weights", an evaluation's few requests)
    # writes nothing at all; a longer one first appears after it, then redraws at most once per interval
    tqdm_std.tqdm.__init__ = functools.partialmethod(init, mininterval=QUIET_PROGRESS_INTERVAL_S,
                                                     delay=QUIET_PROGRESS_INTERVAL_S)
