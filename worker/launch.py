"""How a job's process is started: one `python -m worker.child` process, or, for a training job
that runs as several data-parallel processes (resources.processes, default one per GPU),
`accelerate launch` starting that many copies of it (torchrun underneath; DeepSpeed ZeRO-3 when
the spec asks for it). Also what the ranks share with the supervisor: which rank is the main
one, the per-rank error files, and the exit code the job's processes agreed on.

torchrun starts each rank in a session of its own, so a signal to the launcher's process group
does not reach the ranks by itself: `job_groups` finds their groups for the supervisor, and each
rank asks the kernel to SIGKILL it when the launcher dies (`die_with_parent`)."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from mathrl.specs import AnySpec
from runtime.processes import die_with_parent as die_with_parent  # the job and its ranks import these from here
from runtime.processes import is_main as is_main
from runtime.processes import rank as rank
from runtime.processes import world_size as world_size
from worker.attempt import AttemptDir


def num_processes(spec: AnySpec) -> int:
    """How many processes the job runs as on one node (its kind's needs: kinds/<kind>.py)."""
    from kinds import home

    return home(spec).needs(spec).processes


def uses_deepspeed(spec: AnySpec) -> bool:
    from kinds import home

    return home(spec).needs(spec).deepspeed


def child_args(job_id: str, owner: str, attempt: int) -> list[str]:
    """`python` + these: one job process (owner and attempt: the fence of its writes)."""
    return ["-m", "worker.child", job_id, owner, str(attempt)]


def job_command(
    spec: AnySpec,
    job_id: str,
    owner: str,
    attempt: int,
    cpu_count: int | None = None,
    have_deepspeed: bool | None = None,
) -> list[str]:
    """The job process's command line (cpu_count, have_deepspeed: this machine's, by default)."""
    if have_deepspeed is None:
        have_deepspeed = importlib.util.find_spec("deepspeed") is not None
    child = child_args(job_id, owner, attempt)
    n = num_processes(spec)
    if n <= 1:
        return [sys.executable, *child]
    if spec.resources.gpus == 0:
        return accelerate_cpu_launch(n, max(1, (cpu_count or os.cpu_count() or 1) // n)) + child
    cmd = _accelerate_launch(n)
    if uses_deepspeed(spec) and have_deepspeed:
        # TRL's ZeRO-3 recipe: shard parameters at load, gather a 16-bit model to save, no offload
        cmd += [
            "--use_deepspeed",
            "--zero_stage",
            "3",
            "--zero3_init_flag",
            "true",
            "--zero3_save_16bit_model",
            "true",
            "--offload_optimizer_device",
            "none",
            "--offload_param_device",
            "none",
            "--mixed_precision",
            "bf16",
        ]
    else:
        # (deepspeed asked for but not installed: launched anyway, every rank's check fails with the reason)
        cmd += ["--multi_gpu", "--mixed_precision", "bf16"]
    return cmd + child


def _accelerate_launch(n: int) -> list[str]:
    # port 0: a free one, jobs side by side
    return [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--num_processes",
        str(n),
        "--num_machines",
        "1",
        "--main_process_port",
        "0",
        "--dynamo_backend",
        "no",
    ]


def accelerate_cpu_launch(n: int, threads: int) -> list[str]:
    """`accelerate launch` of n data-parallel CPU processes (gloo), `threads` each, without the
    script: accelerate's `--cpu` means one process (or mpirun); its torchrun launcher is the one
    behind --multi_gpu, and the trainer picks the CPU itself."""
    return [
        *_accelerate_launch(n),
        "--multi_gpu",
        "--mixed_precision",
        "no",
        "--num_cpu_threads_per_process",
        str(threads),
    ]


def describe(cmd: list[str]) -> str:
    if "accelerate.commands.launch" not in cmd:
        return "1 process"
    n = cmd[cmd.index("--num_processes") + 1]
    how = (
        "DeepSpeed ZeRO-3"
        if "--use_deepspeed" in cmd
        else ("CPU, gloo" if "--num_cpu_threads_per_process" in cmd else "DDP")
    )
    return f"{n} processes (accelerate launch, {how})"


# ---- inside the job's processes ------------------------------------------------------------


def error_file(out: Path) -> Path:
    """Where this rank writes its last error: error.txt for the main rank, error-rank-N.txt else."""
    return AttemptDir(out).rank_error(0 if is_main() else rank())


# ---- in the supervisor -----------------------------------------------------------------------


def job_exit_code(code: int, out: Path) -> int:
    """The job's exit code. `accelerate launch` exits 1 when any rank fails, whatever the rank's
    own code said (stopped on request, kind not available): the main rank's code, when it
    failed, says which. 0 only when every rank exited 0."""
    f = AttemptDir(out).exit_code
    if code <= 0 or not f.exists():
        return code
    try:
        main_code = int(f.read_text().strip())
    except ValueError:
        return code
    return main_code if main_code != 0 else code


def job_groups(pid: int) -> set[int]:
    """The process groups of `pid` and of every process below it (Linux /proc; ranks started by
    torchrun lead groups of their own)."""
    children: dict[int, list[int]] = {}
    pgid: dict[int, int] = {}
    for d in Path("/proc").iterdir() if Path("/proc").is_dir() else []:
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "
        p = int(d.name)
        children.setdefault(int(fields[1]), []).append(p)
        pgid[p] = int(fields[2])
    groups, todo = {pid}, [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            groups.add(pgid.get(c, c))
            todo.append(c)
    return groups
