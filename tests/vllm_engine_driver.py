"""Run the project's VLLMVLM on the real vLLM offline engine; used by tests/test_vllm.py.

Runs in the vLLM environment (tools/vllm/install.sh), which the test suite's own
interpreter is not: ``STEREOLENS_VLLM_PYTHON tests/vllm_engine_driver.py JOB.json OUT.json``.
JOB holds one registry entry (``spec``: name, backend, model, settings) and batches of
requests (VLMRequest fields). The model is loaded once, through the registry's
``load_model``, and each batch is one ``VLLMVLM.answer`` call. OUT holds the answers per
batch, the engine's keyword arguments, the KV-cache setting the engine saw, timings and
versions. vLLM starts its engine with the spawn method, hence the ``__main__`` guard.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time


def main(job_path: str, out_path: str) -> int:
    from stereolens.models.registry import ModelSpec, load_model
    from stereolens.models.requests import VLMRequest

    job = json.loads(open(job_path).read())
    spec = ModelSpec(kind="vlm", **job["spec"])
    t0 = time.monotonic()
    vlm = load_model(spec)
    load_s = time.monotonic() - t0
    answers, seconds = [], []
    for batch in job["batches"]:
        requests = [
            VLMRequest(**{**r, "choices": tuple(r["choices"]) if r.get("choices") else None})
            for r in batch
        ]
        t1 = time.monotonic()
        # an item's own failure (models.ask.ItemFailure) travels as {"item_failure": reason}
        answers.append(
            [a if isinstance(a, str) else {"item_failure": a.reason} for a in vlm.answer(requests)]
        )
        seconds.append(time.monotonic() - t1)
    import torch
    import vllm

    out = {
        "answers": answers,
        "batch_seconds": seconds,
        "load_s": load_s,
        "backend_class": type(vlm).__name__,
        "engine_kwargs": vlm.engine_kwargs,
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE"),
        "vllm": vllm.__version__,
        "torch": torch.__version__,
        "driver_max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    del vlm  # shuts the engine down before this process exits
    tmp = f"{out_path}.tmp"
    with open(tmp, "w") as fh:
        json.dump(out, fh, indent=1)
    os.replace(tmp, out_path)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
