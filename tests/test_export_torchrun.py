"""torchrun --nproc-per-node 2 -m avex.data export: a process killed mid-export (SIGKILL, no
chance to clean up) stops the job, and the same command run again resumes from the clips every
process had written, to the cache one process exports."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from file_module import load_file

pytest.importorskip("av", reason="the export reads media with PyAV (the media extra)")
pytest.importorskip("soundfile", reason="the example writes WAV with soundfile")

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train_once_prune_anywhere.py"
REPO = EXAMPLE.parents[1]


def load(path: Path, name: str):
    return load_file(path, name)


def rank_pid(parent: int, rank: int) -> int | None:
    """The pid of the worker of ``rank`` under the torchrun process ``parent``."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            chain, pid = [], int(entry.name)
            while pid > 1 and len(chain) < 8:
                pid = int((Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1]
                          .split()[1])
                chain.append(pid)
        except (OSError, ValueError, IndexError):
            continue
        if parent in chain and f"RANK={rank}".encode() in environ and \
                b"TORCHELASTIC_RUN_ID=" in b"\n".join(environ):
            return int(entry.name)
    return None


@pytest.mark.slow
def test_a_killed_process_resumes_to_the_one_process_cache(tmp_path):
    example = load(EXAMPLE, "train_once_prune_anywhere")
    tests = load(Path(__file__).with_name("test_example.py"), "example_test")
    media = tmp_path / "media"
    example.write_media(media, "qwen2_5_vl")
    rows = [json.loads(line) for line in (media / "captions.jsonl").read_text().splitlines()]
    for i in range(4, 16):   # enough clips that a process is killed with work left
        (media / f"clip{i}.mp4").symlink_to(media / f"clip{i % 4}.mp4")
        # in the split of the file it links to: one file in two splits is refused
        rows.append({"file": f"clip{i}.mp4", "captions": ["a dog barks"],
                     "split": rows[i % 4]["split"]})
    (media / "captions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    example.save_model(example.build_model("qwen2_5_vl"), example.build_processor("qwen2_5_vl"),
                       tmp_path / "model")
    clips = tmp_path / ".cache2.export" / "clips"
    rank1 = {f"{r['file']}.safetensors" for r in rows[1::2]}

    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", "2", "-m", "avex.data", "export", "--media", str(media),
               "--captions", str(media / "captions.jsonl"), "--model", str(tmp_path / "model"),
               "--out", str(tmp_path / "cache2"), "--no-progress"]
    job = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           env={**os.environ, "OMP_NUM_THREADS": "1"})
    deadline, victim = time.time() + 300, None
    while time.time() < deadline and job.poll() is None:
        done = {p.name for p in clips.glob("*.safetensors")} if clips.exists() else set()
        if done & rank1:
            victim = rank_pid(job.pid, 1)
            if victim is not None:
                os.kill(victim, signal.SIGKILL)
                break
        time.sleep(0.02)
    output = job.communicate(timeout=300)[0].decode(errors="replace")
    assert victim is not None, "process 1 was not found mid-export:\n" + output[-2000:]
    assert job.returncode != 0 and not (tmp_path / "cache2").exists()
    kept = {p.name for p in clips.glob("*.safetensors")}
    assert kept & rank1 and len(kept) < len(rows)

    again = subprocess.run(command, cwd=REPO, capture_output=True, text=True,
                           env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    assert "resuming the export" in again.stdout
    assert not clips.parent.exists()
    one = subprocess.run([sys.executable, "-m", "avex.data", *command[command.index("export"):-3],
                          "--out", str(tmp_path / "cache1"), "--no-progress"],
                         cwd=REPO, capture_output=True, text=True)
    assert one.returncode == 0, one.stderr[-2000:]
    tests.same_cache(tmp_path / "cache1", tmp_path / "cache2")
