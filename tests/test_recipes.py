"""Cluster recipes parse, are self-consistent, carry no credentials, and run real ``loopscale`` commands."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "cluster" / "recipes"
SUBCOMMANDS = ("model", "train", "fit", "report", "tune-lr", "sweep", "run")

# Instance facts the AWS recipe relies on (AWS instance-type pages): vCPUs and NVIDIA GPUs.
INSTANCES = {"m5.2xlarge": (8, 0), "p5.48xlarge": (192, 8)}


def _load(name: str):
    return yaml.safe_load((RECIPES / name).read_text())


def _cli_group():
    """The click group behind ``loopscale`` (an import error fails the recipe checks, it does not skip them)."""
    import typer

    from loopscale.sweep.cli import app

    return typer.main.get_command(app)


def check_loopscale_command(cmd: str) -> list[str]:
    """Assert ``cmd`` is ``loopscale <subcommand> ...`` with options that subcommand accepts; return argv."""
    argv = shlex.split(cmd)
    assert argv[0] == "loopscale", cmd
    assert argv[1] in SUBCOMMANDS, f"{argv[1]!r} is not a loopscale subcommand ({', '.join(SUBCOMMANDS)})"
    group = _cli_group()
    assert argv[1] in group.commands, f"loopscale.sweep.cli.app has no command {argv[1]!r}"
    sub = group.commands[argv[1]]
    known = {o for p in sub.params for o in (*p.opts, *p.secondary_opts)}
    used = {a.split("=", 1)[0] for a in argv[2:] if a.startswith("--")}
    assert used <= known, f"`loopscale {argv[1]}` has no option(s) {sorted(used - known)}"
    return argv


def _joined(text: str) -> str:
    """``text`` with comment markers dropped and backslash continuations joined (a recipe's header, a README)."""
    lines = [re.sub(r"^\s*#\s?", "", ln) for ln in text.splitlines()]
    return re.sub(r"\\\s*\n\s*", " ", "\n".join(lines))


def _submitted_commands(text: str) -> list[str]:
    """``loopscale ...`` commands after ``ray job submit ... --`` in a recipe's comments (continuations joined)."""
    return [m.group(1).strip() for m in re.finditer(r"ray job submit .*?-- +(loopscale [^\n\"`]+)", _joined(text))]


def _strip_env(argv: list[str]) -> list[str]:
    """``argv`` without leading ``NAME=value`` environment assignments."""
    while argv and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", argv[0]):
        argv = argv[1:]
    return argv


def parse_loopscale_command(cmd: str) -> tuple[str, dict]:
    """Parse ``[VAR=value ...] loopscale SUB ...`` with the CLI's own parser (as the console script would, without
    running it); return the subcommand and its parameters. Fails on anything the CLI would refuse to parse."""
    import typer

    from loopscale.sweep.cli import app

    argv = _strip_env(shlex.split(cmd, comments=True))
    assert argv and argv[0] == "loopscale", cmd
    group = typer.main.get_command(app)
    assert len(argv) > 1 and argv[1] in group.commands, f"{cmd!r}: not a loopscale subcommand"
    try:
        ctx = group.commands[argv[1]].make_context(f"loopscale {argv[1]}", list(argv[2:]))
    except Exception as e:  # click's UsageError / NoSuchOption / BadParameter
        raise AssertionError(f"`loopscale {argv[1]}` would refuse {cmd!r}: {e}") from e
    return argv[1], ctx.params


def _spec_tunes_lr(params: dict) -> bool:
    """Whether the spec a parsed command names has ``lr: tune``; a shell variable (``$SPEC``) may be any spec, so
    it counts as one that does. A repository path is looked up under this checkout's ``configs/``."""
    from loopscale.sweep.presets import PRESETS, resolve_spec
    from loopscale.sweep.spec import load_spec

    arg = params.get("spec_path")
    if arg is None or arg in PRESETS:
        return resolve_spec(arg, params.get("preset"))[0].lr == "tune"
    if "$" in arg:
        return True
    tail = arg.split("configs/", 1)
    assert len(tail) == 2, f"spec {arg!r} is not one of this repository's configs/"
    path = ROOT / "configs" / tail[1]
    assert path.is_file(), f"spec {arg!r}: no {path}"
    return load_spec(path).lr == "tune"


def check_pipeline(cmds: list[str], where: str) -> list[tuple[str, dict]]:
    """Every command parses with the CLI's parser, and no ``sweep`` of an ``lr: tune`` spec runs on a folder without
    a ``tune-lr`` of that folder before it (sweep exits 2 there: no LR table); return the parsed commands."""
    assert cmds, f"{where}: no loopscale command"
    parsed = [parse_loopscale_command(c) for c in cmds]
    tuned = set()
    for cmd, (sub, params) in zip(cmds, parsed, strict=True):
        if sub == "tune-lr":
            tuned.add(str(params["out"]))
        elif sub == "sweep" and _spec_tunes_lr(params):
            assert str(params["out"]) in tuned, (
                f"{where}: {cmd!r} sweeps an `lr: tune` spec with no `loopscale tune-lr` of {params['out']} before "
                "it: on a new folder sweep exits 2 (no LR table); run `loopscale run` (or tune-lr first)"
            )
    return parsed


def _slurm_commands(text: str) -> list[str]:
    return [ln.strip().split(" || ")[0] for ln in text.splitlines() if ln.strip().startswith("loopscale ")]


def _readme_cluster_section() -> str:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    m = re.search(r"### From a laptop to a cluster.*?(?=\n### )", readme, re.S)
    assert m, "README has no 'From a laptop to a cluster' section"
    return m.group(0)


def _readme_block_commands() -> list[str]:
    """The loopscale commands of the README's 'From a laptop to a cluster' code block, in order."""
    block = re.search(r"```bash\n(.*?)```", _readme_cluster_section(), re.S)
    assert block
    return [
        ln.strip()
        for ln in _joined(block.group(1)).splitlines()
        if _strip_env(shlex.split(ln, comments=True))[:1] == ["loopscale"]
    ]


def _all_recipe_commands() -> dict[str, list[str]]:
    return {
        "ray-cluster-aws.yaml": _submitted_commands((RECIPES / "ray-cluster-aws.yaml").read_text()),
        "kuberay-raycluster.yaml": _submitted_commands((RECIPES / "kuberay-raycluster.yaml").read_text()),
        "kuberay-rayjob.yaml": [_load("kuberay-rayjob.yaml")["spec"]["entrypoint"]],
        "slurm-sbatch.sh": _slurm_commands((RECIPES / "slurm-sbatch.sh").read_text()),
        "README block": _readme_block_commands(),
        "README recipe list": _submitted_commands(_readme_cluster_section()),
    }


@pytest.mark.parametrize("where", ["ray-cluster-aws.yaml", "kuberay-raycluster.yaml", "kuberay-rayjob.yaml", "slurm-sbatch.sh", "README block", "README recipe list"])  # fmt: skip
def test_recipe_commands_parse_and_tune_the_lr_before_the_grid(where):
    """Each recipe's (and the README's cluster section's) loopscale commands are accepted by the CLI's own parser, and
    configs/paper.yaml (`lr: tune`) is never handed to `loopscale sweep` on a folder no `tune-lr` filled first:
    there sweep exits 2 at once ("no LR table"), after the cluster (4 x 8 GPUs on SLURM) was allocated."""
    check_pipeline(_all_recipe_commands()[where], where)


def test_check_pipeline_catches_a_sweep_without_its_lr_table():
    """The checker itself: sweep of paper.yaml alone fails, after tune-lr of the same folder passes, a shell $SPEC
    counts as a spec that may tune, a fixed-LR spec needs nothing, and a bad option value is refused."""
    with pytest.raises(AssertionError, match="no `loopscale tune-lr`"):
        check_pipeline(["loopscale sweep configs/paper.yaml --out o"], "t")
    with pytest.raises(AssertionError, match="no `loopscale tune-lr`"):
        check_pipeline(["loopscale tune-lr configs/paper.yaml --out a", "loopscale sweep configs/paper.yaml --out b"], "t")
    with pytest.raises(AssertionError, match="no `loopscale tune-lr`"):
        check_pipeline(['loopscale sweep "$SPEC" --out "$OUT"'], "t")
    check_pipeline(["loopscale tune-lr configs/paper.yaml --out o", "loopscale sweep configs/paper.yaml --out o"], "t")
    check_pipeline(["loopscale sweep configs/cpu.yaml --out o", "loopscale run configs/paper.yaml --out p"], "t")
    with pytest.raises(AssertionError, match="would refuse"):
        check_pipeline(["loopscale run configs/paper.yaml --out o --num-cpus zero"], "t")


def test_every_recipe_is_tested():
    """The recipe folder holds exactly the recipes these tests know about."""
    assert sorted(p.name for p in RECIPES.iterdir()) == sorted(
        ["ray-cluster-aws.yaml", "kuberay-raycluster.yaml", "kuberay-rayjob.yaml", "slurm-sbatch.sh"]
    )


@pytest.mark.parametrize("name", ["ray-cluster-aws.yaml", "kuberay-raycluster.yaml", "kuberay-rayjob.yaml", "slurm-sbatch.sh"])  # fmt: skip
def test_no_credentials_in_recipes(name):
    """No cloud keys, passwords or literal Ray tokens are written into a recipe."""
    text = (RECIPES / name).read_text()
    assert not re.search(r"AKIA[0-9A-Z]{16}", text)
    assert not re.search(r"(?i)(aws_secret_access_key|aws_access_key_id|password|private_key)\s*[:=]", text)
    assert not re.search(r"RAY_AUTH_TOKEN\s*=\s*['\"]?[0-9a-f]{16,}", text)
    assert not re.search(r"(?i)ssh_private_key", text)


def test_aws_launcher_schema_and_resources():
    """Ray's own cluster-config JSON schema accepts it; node types, autoscaling bounds and GPUs are consistent."""
    cfg = _load("ray-cluster-aws.yaml")
    pytest.importorskip("jsonschema")
    from ray.autoscaler._private.util import validate_config

    validate_config(cfg)
    types = cfg["available_node_types"]
    assert cfg["provider"]["type"] == "aws" and cfg["head_node_type"] in types
    head = types[cfg["head_node_type"]]
    assert head["resources"].get("GPU", 0) == 0 and head["resources"]["CPU"] == 0  # head runs no trials
    gpu_types = {k: v for k, v in types.items() if v["resources"].get("GPU", 0) > 0}
    assert gpu_types, "no GPU worker type"
    for name, t in types.items():
        vcpu, gpus = INSTANCES[t["node_config"]["InstanceType"]]
        assert t["resources"].get("GPU", 0) == gpus, f"{name}: GPU resource != instance's {gpus}"
        assert t["resources"]["CPU"] <= vcpu, f"{name}: CPU resource exceeds the instance's {vcpu} vCPUs"
    for name, t in gpu_types.items():
        assert 0 <= t["min_workers"] <= t["max_workers"] <= cfg["max_workers"], name
        assert t["max_workers"] > t["min_workers"], f"{name}: no room to autoscale"
        assert t["node_config"]["InstanceMarketOptions"]["MarketType"] == "spot"
        # the launcher's own instance profile goes to the head only: workers that write --storage on S3 need one
        assert t["node_config"]["IamInstanceProfile"] == {"Name": "loopscale-worker"}
        assert "--instance-profile-name loopscale-worker" in (RECIPES / "ray-cluster-aws.yaml").read_text()
        # the autoscaler launches workers with the head's role, which must be allowed to pass theirs
        assert re.search(r"put-role-policy --role-name ray-autoscaler-v1 .*iam:PassRole.*role/loopscale-worker",
                         _joined((RECIPES / "ray-cluster-aws.yaml").read_text()))
    # a current GPU image (the launcher's default AMI is Ubuntu 18.04 with CUDA 11.2: too old for H100 / torch 2.13)
    for name, t in types.items():
        assert t["node_config"]["ImageId"] == ("resolve:ssm:/aws/service/deeplearning/ami/x86_64/"
                                               "base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id"), name
    # trials tokenize into the node's own disk, and --out (on the head) is copied off before `ray down`
    assert all("LOOPSCALE_CACHE=/tmp/" in c for c in cfg["worker_start_ray_commands"] if "ray start" in c)
    # the head's --out: a bare ~ was expanded by the laptop's shell to the laptop's home, so nothing was copied
    text = (RECIPES / "ray-cluster-aws.yaml").read_text()
    assert "ray rsync-down cluster/recipes/ray-cluster-aws.yaml '~/runs/paper' ./runs/" in text
    assert not re.search(r"rsync-down \S+ ~", text)
    # the autoscaler's role reads the workers' AMI id from its public SSM parameter (ImageId: resolve:ssm:)
    assert re.search(r"put-role-policy --role-name ray-autoscaler-v1 .*ssm:GetParameters.*parameter/aws/service/",
                     _joined(text))
    # what the launching machine needs beyond ray[tune] (boto3 for the AWS launcher, ray[default] for job submit)
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(d.startswith("ray[default]") for d in extras["cluster"]) and any(
        d.startswith("boto3") for d in extras["cluster"])
    assert "pip install -e \".[cluster]\"" in text
    # the package is installed from the checkout the launcher copies to every node
    mounts = cfg["file_mounts"]
    assert mounts["~/loopscale"] == "."
    for cmds in (cfg["setup_commands"] + cfg["head_setup_commands"], cfg["setup_commands"] + cfg["worker_setup_commands"]):
        assert any("pip install" in c and "~/loopscale" in c for c in cmds)
    assert any('"ray[default' in c and "2.60" in c for c in cfg["setup_commands"])
    # token auth forced on, the dashboard (job API) on loopback
    starts = cfg["head_start_ray_commands"] + cfg["worker_start_ray_commands"]
    assert all("RAY_AUTH_MODE=token" in c for c in starts if "ray start" in c)
    assert any("--dashboard-host=127.0.0.1" in c for c in cfg["head_start_ray_commands"])
    assert "--num-cpus=0" in " ".join(cfg["head_start_ray_commands"])
    cmds = _submitted_commands((RECIPES / "ray-cluster-aws.yaml").read_text())
    assert cmds, "no `ray job submit ... -- loopscale ...` line in the recipe's comments"
    for c in cmds:
        argv = check_loopscale_command(c)
        assert argv[1] == "run" and "--address" in argv
        assert argv[argv.index("--storage") + 1].startswith("s3://")  # shared by all nodes


def _containers(pod_template):
    return pod_template["spec"]["containers"]


def _check_token_env(container):
    env = {e["name"]: e for e in container.get("env", [])}
    assert env["RAY_AUTH_MODE"]["value"] == "token", container["name"]
    assert "value" not in env["RAY_AUTH_TOKEN"], f"{container['name']}: literal token"
    assert env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "loopscale-ray-token", "key": "auth_token"}


def test_kuberay_raycluster():
    """RayCluster: autoscaling on, GPU worker group whose num-gpus matches the pods' GPU requests and limits."""
    rc = _load("kuberay-raycluster.yaml")
    assert rc["apiVersion"] == "ray.io/v1" and rc["kind"] == "RayCluster"
    spec = rc["spec"]
    assert spec["enableInTreeAutoscaling"] is True and spec["rayVersion"].startswith("2.60")
    head = spec["headGroupSpec"]
    assert head["serviceType"] == "ClusterIP"
    assert head["rayStartParams"]["num-cpus"] == "0"
    for c in _containers(head["template"]):
        _check_token_env(c)
        assert c["resources"].get("limits", {}).get("nvidia.com/gpu", 0) == 0
    groups = spec["workerGroupSpecs"]
    gpu_groups = [g for g in groups if "num-gpus" in g["rayStartParams"]]
    assert gpu_groups
    for g in gpu_groups:
        assert (
            0 <= g["minReplicas"] <= g["replicas"] <= g["maxReplicas"] and g["maxReplicas"] > g["minReplicas"]
        )
        n = int(g["rayStartParams"]["num-gpus"])
        (c,) = _containers(g["template"])
        assert (
            int(c["resources"]["limits"]["nvidia.com/gpu"])
            == n
            == int(c["resources"]["requests"]["nvidia.com/gpu"])
        )
        _check_token_env(c)
    for c in _containers(head["template"]) + [c for g in groups for c in _containers(g["template"])]:
        assert "rayproject/ray:2.60" in c["image"]
        args = " ".join(c["args"])
        assert "$KUBERAY_GEN_RAY_START_CMD" in args and "pip install" in args
        # pip builds in the source folder: never install straight from a mounted (read-only) checkout
        target = re.search(r"pip install (\S+) && \$KUBERAY_GEN_RAY_START_CMD", args).group(1)
        mounts = [m["mountPath"] for m in c.get("volumeMounts", [])]
        assert not any(target == m or target.startswith(m.rstrip("/") + "/") for m in mounts), (target, mounts)
        # the copy leaves out what a checkout may hold beside the source, and is made writable before pip builds
        copy = re.search(rf"tar -C /workspace/loopscale (.*?) -cf - \. \| tar -C {target} -xf - && "
                         rf"chmod -R u\+w {target} && pip install {target}", args)
        assert copy and {"--exclude=./.git", "--exclude=./.venv"} <= set(copy.group(1).split()), args
    assert rc["metadata"]["annotations"]["ray.io/overwrite-container-cmd"] == "true"
    # the operator's own calls to the job API (a RayJob's status) carry the token only when authOptions names it;
    # it reads the Secret's key auth_token, which the header's Secret and the laptop's submit line use too
    assert spec["authOptions"] == {"mode": "token", "secretName": "loopscale-ray-token"}
    header = (RECIPES / "kuberay-raycluster.yaml").read_text()
    assert "create secret generic loopscale-ray-token --from-literal=auth_token=" in header
    assert "{.data.auth_token}" in header and "KubeRay >= 1.6" in header
    # the autoscaler sidecar is a Ray process: without the token no worker pod is ever started
    _check_token_env({"name": "autoscaler", "env": spec["autoscalerOptions"]["env"]})
    # every pod: the identity that reaches --storage, and the corpus volume; the head keeps --out on a volume
    pods = [head["template"]] + [g["template"] for g in groups]
    assert all(p["spec"]["serviceAccountName"] == "loopscale-ray" for p in pods)
    for p in pods:
        (c,) = _containers(p)
        assert {"mountPath": "/data", "name": "loopscale-data", "readOnly": True} in c["volumeMounts"]
    (hc,) = _containers(head["template"])
    assert any(m["mountPath"] == "/home/ray/runs" and m["name"] == "loopscale-runs" for m in hc["volumeMounts"])
    assert {"name": "loopscale-runs", "persistentVolumeClaim": {"claimName": "loopscale-runs"}} in \
        head["template"]["spec"]["volumes"]  # fmt: skip
    for p in pods:
        (c,) = _containers(p)
        assert {"name": "LOOPSCALE_CACHE", "value": "/tmp/loopscale-cache"} in c["env"]
    cmds = _submitted_commands((RECIPES / "kuberay-raycluster.yaml").read_text())
    assert cmds, "no `ray job submit ... -- loopscale ...` line in the recipe's comments"
    for c in cmds:
        check_loopscale_command(c)


def test_kuberay_rayjob():
    """RayJob: runs `loopscale run --resume` on the recipe's RayCluster, its submitter authenticates from the Secret."""
    job = _load("kuberay-rayjob.yaml")
    rc = _load("kuberay-raycluster.yaml")
    assert job["apiVersion"] == "ray.io/v1" and job["kind"] == "RayJob"
    argv = check_loopscale_command(job["spec"]["entrypoint"])
    assert argv[1] == "run" and "--out" in argv and "--resume" in argv  # rerunning the RayJob resumes
    assert argv[argv.index("--storage") + 1].startswith("s3://")  # shared by all pods
    assert job["spec"]["clusterSelector"]["ray.io/cluster"] == rc["metadata"]["name"]
    # named for what it runs (it was loopscale-sweep), and the header's `kubectl logs` follows that job
    assert job["metadata"]["name"] == "loopscale-run"
    assert "kubectl logs -f job/loopscale-run " in (RECIPES / "kuberay-rayjob.yaml").read_text()
    for c in _containers(job["spec"]["submitterPodTemplate"]):
        _check_token_env(c)


def test_slurm_script():
    """sbatch script: valid bash, head then workers via srun, `loopscale run` joins with --address (and resumes on
    re-submission), GPUs consistent."""
    path = RECIPES / "slurm-sbatch.sh"
    text = path.read_text()
    if shutil.which("bash"):
        subprocess.run(["bash", "-n", str(path)], check=True)
    sb = dict(re.findall(r"^#SBATCH --([a-z-]+)=(\S+)", text, flags=re.M))
    assert int(sb["nodes"]) >= 2 and sb["ntasks-per-node"] == "1"
    assert re.search(r'GPUS_PER_NODE="\$\{SLURM_GPUS_ON_NODE:-' + sb["gpus-per-node"] + r'\}"', text)
    assert re.search(r'CPUS_PER_NODE="\$\{SLURM_CPUS_PER_TASK:-' + sb["cpus-per-task"] + r'\}"', text)
    head = text.index("ray start --head")
    worker = text.index('ray start --address="$HEAD_ADDRESS"')
    sweep_lines = [ln.strip() for ln in text.splitlines() if ln.strip().startswith("loopscale ")]
    assert len(sweep_lines) == 1 and head < worker < text.index(sweep_lines[0])
    cmd = sweep_lines[0].split(" || ")[0]
    argv = check_loopscale_command(cmd)
    assert argv[1] == "run" and argv[argv.index("--address") + 1] == "$HEAD_ADDRESS" and "--resume" in argv
    assert "export RAY_AUTH_MODE=token" in text and "--dashboard-host=127.0.0.1" in text
    # the head is waited for (a fixed sleep let a slow head fail the driver), and each srun step asks for the
    # node's CPUs and GPUs itself (Slurm >= 22.05 steps do not inherit --cpus-per-task)
    assert 'until ray status --address "$HEAD_ADDRESS"' in text and "sleep 20" not in text
    assert "health-check" not in text  # Ray's help calls `ray health-check` not a public API
    assert text.count('--cpus-per-task="$CPUS_PER_NODE" --gpus-per-node="$GPUS_PER_NODE"') == 2
    assert "export LOOPSCALE_CACHE=" in text
    # it stops the Ray nodes it started (its background srun steps), not every Ray of the user on a shared node
    code = [ln for ln in text.splitlines() if not ln.lstrip().startswith("#")]
    assert not any(re.search(r"\bray\s+stop\b", ln) for ln in code), "the script must not `ray stop`"
    assert "kill $(jobs -p)" in text and text.index("kill $(jobs -p)") > text.index(sweep_lines[0])


def test_check_loopscale_command_rejects_fakes():
    """The command checker itself fails on an unknown subcommand (and, once the CLI loads, an unknown flag)."""
    with pytest.raises(AssertionError, match="not a loopscale subcommand"):
        check_loopscale_command("loopscale sweeep spec.yaml")
    with pytest.raises(AssertionError, match="has no option"):
        check_loopscale_command("loopscale sweep spec.yaml --no-such-flag 1")


_ENV_PREFIX = r"((?:[A-Za-z_][A-Za-z0-9_]*=(?:\"[^\"]*\"|'[^']*'|[^\s\"';&|]+)\s+)*)"


def _job_submit_envs(text: str) -> list[str]:
    """The ``NAME=value`` assignments written before each ``ray job submit --...`` command of ``text``."""
    return [m.group(1).strip() for m in re.finditer(_ENV_PREFIX + r"ray job submit --", _joined(text))]


@pytest.mark.parametrize("where", ["ray-cluster-aws.yaml", "kuberay-raycluster.yaml", "README"])
def test_ray_job_submit_sends_the_token(where):
    """Ray 2.60's job client (JobSubmissionClient: get_auth_headers_if_auth_enabled) sends the token only when its
    own process is in token mode, i.e. RAY_AUTH_MODE=token in its environment: `ray job submit` does not turn token
    mode on from ~/.ray/auth_token or RAY_AUTH_TOKEN, and an `export` in the launcher's head_start_ray_commands does
    not reach a `ray exec` shell. Without it the dashboard refuses the job (401). So every submit line sets it."""
    text = (ROOT / "README.md").read_text(encoding="utf-8") if where == "README" else (RECIPES / where).read_text()
    envs = _job_submit_envs(text)
    assert envs, f"{where}: no `ray job submit` line"
    for env in envs:
        assert re.search(r"(^|\s)RAY_AUTH_MODE=token(\s|$)", env), f"{where}: a `ray job submit` without RAY_AUTH_MODE=token"


def test_ray_job_submit_env_finder():
    """The finder reads assignments, quoted command substitutions included, and only those before the command."""
    assert _job_submit_envs('x "RAY_AUTH_MODE=token ray job submit --address a -- loopscale run"') == ["RAY_AUTH_MODE=token"]
    env = _job_submit_envs('#   A="$(kubectl get s -o jsonpath=\'{.t}\' | base64 -d)" \\\n#     ray job submit --address a')
    assert env == ['A="$(kubectl get s -o jsonpath=\'{.t}\' | base64 -d)"']
    assert _job_submit_envs("RAY_AUTH_MODE=token; ray job submit --address a") == [""]


def test_token_auth_driver_joining_by_address_sets_the_mode():
    """A driver joining with --address HOST:PORT does not turn token mode on by itself (ray.init only does for None /
    'auto'), so the README's cluster block sets RAY_AUTH_MODE=token on such a line, as the SLURM script exports it."""
    for cmd in _readme_block_commands():
        argv = shlex.split(cmd, comments=True)
        if "--address" in argv and argv[argv.index("--address") + 1] not in ("auto",):
            assert "RAY_AUTH_MODE=token" in argv[: argv.index("loopscale")], cmd
    assert "export RAY_AUTH_MODE=token" in (RECIPES / "slurm-sbatch.sh").read_text()


CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def _torch_pin() -> str:
    pin = re.search(r'"torch==([^"]+)"', (ROOT / "pyproject.toml").read_text())
    assert pin, "pyproject.toml pins no torch"
    return pin.group(1)


def _pip_installs_cpu_torch(cmd: str) -> bool:
    argv = shlex.split(cmd.replace(";", " ; ").replace("&&", " && "))
    return f"torch=={_torch_pin()}" in argv and CPU_INDEX in argv and argv[argv.index(CPU_INDEX) - 1] == "--index-url"


def test_cpu_heads_install_the_cpu_torch_gpu_workers_the_default():
    """The CPU-only heads (AWS m5.2xlarge, the KubeRay head pod) install torch's CPU build of the pinned version from
    PyTorch's CPU index before the package (whose pin it then satisfies as 2.13.0+cpu), instead of PyPI's CUDA build
    for Linux x86_64; the GPU workers install the package as is (PyPI's torch, the CUDA build)."""
    cfg = _load("ray-cluster-aws.yaml")
    head = cfg["setup_commands"] + cfg["head_setup_commands"]  # the launcher runs these, in this order, on the head
    worker = cfg["setup_commands"] + cfg["worker_setup_commands"]
    install = [i for i, c in enumerate(head) if re.search(r"pip install (-e )?~/loopscale\b", c)]
    cpu = [i for i, c in enumerate(head) if _pip_installs_cpu_torch(c)]
    assert install and cpu and cpu[0] < install[0], head
    assert any(re.search(r"pip install (-e )?~/loopscale\b", c) for c in worker), worker
    assert not any(CPU_INDEX in c for c in worker), worker
    rc = _load("kuberay-raycluster.yaml")["spec"]
    for c in _containers(rc["headGroupSpec"]["template"]):
        args = " ".join(c["args"])
        assert _pip_installs_cpu_torch(args) and args.index(CPU_INDEX) < args.index("pip install /tmp/loopscale"), args
    for g in rc["workerGroupSpecs"]:
        for c in _containers(g["template"]):
            assert CPU_INDEX not in " ".join(c["args"])


def test_readme_says_when_pip_takes_the_cpu_torch():
    """The quick start does not claim the pin takes the CPU build on any CPU machine (PyPI's Linux x86_64 torch wheel
    is the CUDA build; the CPU one comes from a pip configured with it, as on CI, or from PyTorch's CPU index); it names
    the pinned version and the index."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    quick = re.search(r"## Quick start\n(.*?)\n## ", readme, re.S).group(1)
    assert not re.search(r"CPU-only machine the pinned\s+`torch==[^`]+`\s+takes the CPU build", quick)
    assert f"torch=={_torch_pin()}" in quick and CPU_INDEX in quick
    assert "--extra-index-url" in quick or "--index-url" in quick
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert "on CPU machines this takes the local CPU wheel" not in pyproject


def test_local_cluster_demo_joins_its_own_head_by_address():
    """cluster/local_cluster_demo.sh joins the head it started by the HOST:PORT of that head's own address file (not
    `--address auto`, which RAY_ADDRESS overrides and which, with several Rays on the machine, scans their processes),
    starts it on a free port with the auth mode the driver also has, and stops only that head (never `ray stop`)."""
    path = ROOT / "cluster" / "local_cluster_demo.sh"
    text = path.read_text()
    if shutil.which("bash"):
        subprocess.run(["bash", "-n", str(path)], check=True)
    code = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    (sweep,) = [ln for ln in code if ln.startswith('"$LOOPSCALE" sweep')]
    argv = shlex.split(sweep.split("|")[0])
    assert argv[argv.index("--address") + 1] == "$ADDRESS", sweep
    assert 'ADDRESS="$(cat "$WORK/ray/ray_current_cluster")"' in code and 'export RAY_TMPDIR="$WORK"' in code
    (start,) = [ln for ln in code if ln.startswith('"$RAY" start')]
    assert "--head" in start and "--port=0" in start and "--block" in start
    assert "unset RAY_ADDRESS" in code
    assert text.index("export RAY_AUTH_MODE=") < text.index('"$RAY" start')  # head and driver share one mode
    assert not any(re.search(r"\bray\b.*\bstop\b|\$RAY\"? stop", ln) for ln in code), "the demo must not `ray stop`"
    assert 'kill -TERM "$HEAD_PID"' in text


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash to run the SLURM recipe's wait loop")
def test_slurm_script_waits_for_the_head_and_gives_up_with_a_message(tmp_path):
    """The recipe's wait for the Ray head, run with a stand-in `ray` that answers on its third call: it waits through
    the failed tries and goes on; with a head that never answers it stops with exit 1 and says so after
    HEAD_WAIT_S, instead of starting workers against nothing."""
    text = (RECIPES / "slurm-sbatch.sh").read_text()
    start = text.index("# wait until the head answers")
    block = text[start:text.index("\ndone\n", start) + len("\ndone\n")]
    stub = tmp_path / "bin" / "ray"
    stub.parent.mkdir()
    calls = tmp_path / "calls"
    stub.write_text(f'#!/usr/bin/env bash\necho "$*" >> {calls}\n'
                    f'[ "$(wc -l < {calls})" -ge 3 ]\n')  # fmt: skip
    stub.chmod(0o755)
    script = tmp_path / "wait.sh"
    script.write_text("set -euo pipefail\nsleep() { :; }\nHEAD_ADDRESS=10.0.0.1:6379\n" + block + "echo head-up\n")
    env = {**os.environ, "PATH": f"{stub.parent}:{os.environ['PATH']}"}
    res = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, timeout=60)
    assert res.returncode == 0 and res.stdout.strip() == "head-up", res
    assert calls.read_text().splitlines() == ["status --address 10.0.0.1:6379"] * 3
    calls.write_text("")
    stub.write_text("#!/usr/bin/env bash\nexit 1\n")
    res = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=60,
                         env={**env, "HEAD_WAIT_S": "0"})  # fmt: skip
    assert res.returncode == 1 and "head-up" not in res.stdout
    assert res.stderr.strip() == "Ray head at 10.0.0.1:6379 not up after 0 s", res.stderr


def _slurm_block(first: str, last: str) -> str:
    """The SLURM recipe's lines from the one starting ``first`` up to the first line equal to ``last`` after it."""
    text = (RECIPES / "slurm-sbatch.sh").read_text()
    start = text.index(first)
    return text[start:text.index("\n" + last + "\n", start) + len(last) + 2]


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash to run the SLURM recipe's blocks")
def test_slurm_script_takes_a_reachable_head_address_and_waits_for_every_node(tmp_path):
    """A head whose hostname /etc/hosts maps to loopback gave the workers 127.0.1.1:6379, their own loopback: they
    never joined, and the grid ran on the head alone without a word. The recipe now takes the node's first
    non-loopback address (and stops with a message when it has none), then waits until every node has joined,
    going on with a warning after WORKERS_WAIT_S. Run here with stand-in `srun` and `python`."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "srun").write_text('#!/usr/bin/env bash\ncase "${@: -1}" in --ip-address) echo "$IP1";; '
                               '--all-ip-addresses) echo "$ALL";; esac\n')  # fmt: skip
    count = tmp_path / "count"
    (bin_ / "python").write_text(f'#!/usr/bin/env bash\nn=$(( $(cat {count} 2>/dev/null || echo 0) + 1 ))\n'
                                 f'echo $n > {count}\n[ "$n" -le "$FAIL" ] && exit 1\necho $(( n - FAIL ))\n')  # fmt: skip
    for f in bin_.iterdir():
        f.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}"}
    ip = tmp_path / "ip.sh"
    text = (RECIPES / "slurm-sbatch.sh").read_text()
    block = text[text.index('HEAD_IP="$(srun'):text.index('HEAD_ADDRESS="${HEAD_IP}')]
    ip.write_text("set -euo pipefail\nHEAD_NODE=n1\n" + block + 'echo "$HEAD_IP"\n')

    def head_ip(ip1: str, all_: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(ip)], capture_output=True, text=True, timeout=60,
                              env={**env, "IP1": ip1, "ALL": all_})  # fmt: skip

    assert head_ip("10.0.0.5", "10.9.9.9").stdout.strip() == "10.0.0.5"
    assert head_ip("127.0.1.1", "10.1.2.3 fe80::1").stdout.strip() == "10.1.2.3"
    refused = head_ip("127.0.1.1", "")
    assert refused.returncode == 1 and refused.stdout == ""
    assert refused.stderr.strip() == "no address of n1 that other nodes can reach (hostname --ip-address gives loopback)"
    wait = tmp_path / "wait.sh"
    # SECONDS unset, then set: a plain variable that stays 0 (the script's elapsed time read 1 s when a second
    # boundary passed during the run, under load)
    wait.write_text("set -euo pipefail\nsleep() { :; }\nunset SECONDS; SECONDS=0\nNODES=(a b c)\n"
                    "HEAD_ADDRESS=10.0.0.5:6379\n"
                    + _slurm_block("# wait until every node has joined", "done") + 'echo "joined=$joined"\n')  # fmt: skip
    # the driver check fails twice (no head answer yet), then counts 1, 2, 3 nodes: it waits for the third
    res = subprocess.run(["bash", str(wait)], capture_output=True, text=True, timeout=60, env={**env, "FAIL": "2"})
    assert res.returncode == 0 and res.stdout.strip() == "joined=3" and res.stderr == "", res
    assert count.read_text().strip() == "5"
    count.unlink()
    late = subprocess.run(["bash", str(wait)], capture_output=True, text=True, timeout=60,
                          env={**env, "FAIL": "1000", "WORKERS_WAIT_S": "0"})  # fmt: skip
    assert late.returncode == 0 and late.stdout.strip() == "joined=0"
    assert late.stderr.strip() == "warning: 0 of 3 Ray nodes joined after 0 s; the run goes on with them"
