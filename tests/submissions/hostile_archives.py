"""Archives written header by header, as a hostile submitter would craft them where tarfile's writer would
not: a pax size record that disagrees with its ustar size, a long-name header past its bound, a sparse
member."""

from __future__ import annotations

import gzip
import tarfile
from pathlib import Path


def _padded(data: bytes) -> bytes:
    return data + bytes(-len(data) % tarfile.BLOCKSIZE)


def desynchronised(path: Path, long_name: bytes, filler: int = 0) -> Path:
    """A pax header whose ``size`` record (0) overrides its member's ustar size (1 GiB): a walk of the
    ustar sizes takes the rest of the stream for that member's data and stops, while tarfile reads on, to
    a GNU long-name header announcing ``len(long_name) + filler`` bytes (``filler`` zeros after the name),
    then a member."""
    hidden = tarfile.TarInfo("environment.json")
    hidden.size = 2**30
    hidden.pax_headers = {"size": "0"}
    blocks = hidden.tobuf(tarfile.PAX_FORMAT)
    name = tarfile.TarInfo("././@LongLink")
    name.type = tarfile.GNUTYPE_LONGNAME
    name.size = len(long_name) + filler
    blocks += name.tobuf(tarfile.GNU_FORMAT) + _padded(long_name + bytes(filler))
    blocks += tarfile.TarInfo("bundle.json").tobuf(tarfile.GNU_FORMAT) + bytes(2 * tarfile.BLOCKSIZE)
    path.write_bytes(gzip.compress(blocks, compresslevel=9))
    return path


def sparse(path: Path, name: str) -> Path:
    """A GNU sparse member (type S) named ``name``, which tarfile counts as a regular file."""
    member = tarfile.TarInfo(name)
    member.type = tarfile.GNUTYPE_SPARSE
    blocks = member.tobuf(tarfile.GNU_FORMAT) + bytes(2 * tarfile.BLOCKSIZE)
    path.write_bytes(gzip.compress(blocks))
    return path
