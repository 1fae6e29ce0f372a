"""What a run records about where it ran (env.json and the columns every table row carries), and its log lines."""
from __future__ import annotations

import datetime
import os
import platform
import subprocess
import sys
import time
from typing import Any

import pandas as pd
import torch
import triton

import gdnlab
from benchmarks.inputs import parse_label
from benchmarks.timing import EAGER_METHOD

#: The run's facts every table row carries.
ENV_KEYS = ("device", "torch", "triton", "date")


def stamp(df: pd.DataFrame, env: dict[str, Any]) -> pd.DataFrame:
    """df with the run's device, torch, Triton and date in every row."""
    return df.assign(**{k: env[k] for k in ENV_KEYS})


def log(*a: Any) -> None:
    """A timestamped progress line on stdout (flushed, so a killed run keeps it)."""
    print(f"[{time.strftime('%H:%M:%S')}]", *a, flush=True)


def implementation(label: str) -> str:
    """What really runs behind a backend label: the peer's distribution, version and dispatch
    (gdnlab.peers.implementation), or "gdnlab" and the lab backend's name."""
    from gdnlab import peers
    name = parse_label(label)[0]
    return peers.implementation(name) if name in peers.PEERS else f"gdnlab {name}"


def host_info() -> dict[str, Any]:
    """The host's CPU model, its logical CPUs, the load average when the run starts and its name: eager and host times
    depend on the host, which a GPU's name does not say (speed notes item 65: every backend's host time doubled
    between two H200 starts)."""
    model = "?"
    try:
        with open("/proc/cpuinfo") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "?")
    except OSError:
        pass
    load = os.getloadavg() if hasattr(os, "getloadavg") else ()
    return dict(cpu=model, cpus=os.cpu_count(), load_average=[round(x, 2) for x in load], name=platform.node())


#: nvidia-smi's fields that name the physical card and its settings, not only its model.
CARD_FIELDS = ("uuid", "pci.bus_id", "vbios_version", "ecc.mode.current", "power.limit", "clocks.applications.graphics")


def card_info(uuid: str | None = None) -> dict[str, str]:
    """Which card the run had: nvidia-smi's CARD_FIELDS of the GPU with this `uuid` (torch's device 0; nvidia-smi
    does not read CUDA_VISIBLE_DEVICES, so its first line need not be that device), or of its first GPU without
    one. Two machine starts with one GPU model, driver and versions can still lend different cards (speed notes
    item 68: FlashQLA's two modes), and only these tell them apart afterwards. Every field is empty where
    nvidia-smi is missing or fails."""
    cmd = ["nvidia-smi", f"--query-gpu={','.join(CARD_FIELDS)}", "--format=csv,noheader"]
    if uuid:
        cmd.insert(1, f"--id={uuid if uuid.startswith('GPU-') else 'GPU-' + uuid}")
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        out = r.stdout if r.returncode == 0 else ""
    except (OSError, subprocess.SubprocessError):
        out = ""
    first = (out.strip().splitlines() or [""])[0]
    values = [v.strip() for v in first.split(",")] if first else []
    return dict(zip(CARD_FIELDS, values + [""] * (len(CARD_FIELDS) - len(values))))


def env_info() -> dict[str, Any]:
    """The device (name, driver, clocks, memory, multiprocessors; which card: card_info), the torch, Triton, CUDA
    versions, each peer's version or why it cannot run and the versions of the compilers they bring (TileLang, CuTe
    DSL), the commit (GDNLAB_COMMIT, set by whoever sends the tree), the host (host_info), the date, how eager calls
    are timed, and the registered backends."""
    from gdnlab import peers
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,clocks.max.sm,memory.total",
                          "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
    p = torch.cuda.get_device_properties(0)
    return dict(device=torch.cuda.get_device_name(0), driver=(smi.split(",") + ["?", "?"])[1].strip(),
                nvidia_smi=smi, sms=p.multi_processor_count, torch=torch.__version__, triton=triton.__version__,
                cuda=torch.version.cuda, peers=peers.peer_status(),
                peer_dependencies=peers.dependency_versions(), commit=os.environ.get("GDNLAB_COMMIT", "?"),
                python=sys.version.split()[0], host=host_info(), card=card_info(str(getattr(p, "uuid", "")) or None),
                date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                eager_method=EAGER_METHOD, backends=list(gdnlab.BACKENDS))
