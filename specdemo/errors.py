"""OpenVINO's exceptions, and the disk's, as sentences for users.

OpenVINO raises RuntimeError with several lines: where it was thrown, at every layer it crossed ("Exception from
src/inference/src/cpp/core.cpp:117:"), the check that failed with its source path, and last the kernel's own words
("expect kvcache type bf16, current: f32 , f32"). A user needs the last part, what was being done, and what to try.
"""

from __future__ import annotations

import errno
import re

# What to try when a compile is refused: the settings that decide which kernels run, and this machine's tune, which
# fills them in where no flag is given.
COMPILE_ADVICE = ("try another --kv-cache-precision, or compile with the defaults after `python -m specdemo tune "
                  "--forget`")


class GenAIError(RuntimeError):
    """OpenVINO GenAI's pipeline could not be made or run; the message is one sentence for users."""


_WHERE = re.compile(r"^(Exception from \S+|Check '.*' failed at \S+?:?\d*:?)\s*$")


def openvino_detail(error: BaseException) -> str:
    """The part of an OpenVINO exception a user can read: its last line that is not a source location."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    words = [line for line in lines if not _WHERE.match(line)]
    if words:
        return words[-1].rstrip(".")
    check = next((re.search(r"Check '(.*)' failed", line) for line in reversed(lines) if "Check '" in line), None)
    return f"its check {check.group(1)} failed" if check else (lines[-1] if lines else type(error).__name__)


def openvino_sentence(error: BaseException, what: str, advice: str = COMPILE_ADVICE) -> str:
    """One sentence: what could not be done, OpenVINO's own reason, and what to try."""
    return f"OpenVINO could not {what} ({openvino_detail(error)}); {advice}."


def is_openvino(error: BaseException) -> bool:
    """Whether `error` is one of OpenVINO's raw exceptions (rather than one of our sentences)."""
    return isinstance(error, RuntimeError) and bool(re.search(r"Exception from |Check '.*' failed", str(error)))


def disk_sentence(error: OSError) -> str:
    """What failed on the disk and what to do, in one sentence (ENOSPC: `clean` frees what specdemo keeps)."""
    where = f" ({error.filename})" if error.filename else ""
    advice = {errno.ENOSPC: "free space on that disk (`python -m specdemo clean` lists what specdemo keeps) and run it again",
              errno.EROFS: "point SPECDEMO_HOME at a writable folder",
              errno.EACCES: "point SPECDEMO_HOME at a folder you may write"}.get(error.errno, "check the disk and run it again")
    return f"a file could not be read or written{where}: {error.strerror or error}; {advice}"


def describe(error: BaseException, what: str = "run the models") -> str:
    """Any error as one line: OpenVINO's raw exceptions as openvino_sentence, the disk's as disk_sentence, ours as
    they are."""
    if is_openvino(error):
        return openvino_sentence(error, what)
    if isinstance(error, OSError) and error.errno is not None:
        return disk_sentence(error)
    return " ".join(str(error).split()) or type(error).__name__
