"""docker/: every compose file validates with ``docker-compose config``, and says what the stack needs.

No Docker engine runs here; ``docker-compose config`` parses, validates and interpolates a file exactly as
``up`` would before starting anything. A missing docker-compose fails these tests (it is part of the
development machine), it never skips them.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from functools import cache
from pathlib import Path

import pytest
import yaml

from ragcache.settings import Settings
from ragcache_cli.config_docs import env_name

DOCKER = Path(__file__).resolve().parents[2] / "docker"
# Each stack as one would start it: one file, or a file and its override.
STACKS = {
    "single": ["compose.yaml"],
    "cluster": ["compose.cluster.yaml"],
    "gpu": ["compose.gpu.yaml"],
    "gpu+lmcache": ["compose.gpu.yaml", "compose.gpu.lmcache.yaml"],
    # Prometheus + Grafana go beside any stack (docker/compose.monitoring.yaml).
    "single+monitoring": ["compose.yaml", "compose.monitoring.yaml"],
    "cluster+monitoring": ["compose.cluster.yaml", "compose.monitoring.yaml"],
    "gpu+monitoring": ["compose.gpu.yaml", "compose.monitoring.yaml"],
}
SETTING_NAMES = {env_name(name) for name in Settings.options()}
RAGCACHE_VARIABLE = re.compile(r"\bRAGCACHE_[A-Z0-9_]+\b")


def compose(files: list[str], *args: str, api_key: str | None = "test-key") -> subprocess.CompletedProcess:
    executable = shutil.which("docker-compose")
    if executable is None:
        pytest.fail("docker-compose is not installed (apt-get install docker-compose)")
    env = {k: v for k, v in os.environ.items() if k != "RAGCACHE_API_KEY"}
    if api_key is not None:
        env["RAGCACHE_API_KEY"] = api_key
    env.setdefault("GRAFANA_ADMIN_PASSWORD", "test-password")
    command = [executable]
    for name in files:
        command += ["-f", str(DOCKER / name)]
    return subprocess.run(command + ["config", *args], capture_output=True, text=True, env=env, timeout=120)


@cache
def resolved(stack: str) -> dict:
    """The stack's configuration as docker-compose resolves it (read-only: shared between tests)."""
    result = compose(STACKS[stack])
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


def test_every_compose_file_is_in_a_stack():
    assert {p.name for p in DOCKER.glob("compose*.yaml")} == {name for files in STACKS.values() for name in files}


@pytest.mark.parametrize("stack", list(STACKS))
def test_compose_config_validates(stack):
    result = compose(STACKS[stack], "-q")
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("stack", list(STACKS))
def test_compose_refuses_to_start_without_an_api_key(stack):
    # The service binds 0.0.0.0 in a container: without a key it would be open to the network.
    result = compose(STACKS[stack], "-q", api_key=None)
    assert result.returncode != 0
    assert "RAGCACHE_API_KEY" in result.stderr


@pytest.mark.parametrize("stack", list(STACKS))
def test_stack_shape(stack):
    services = resolved(stack)["services"]
    ragcache = services["ragcache"]
    assert ragcache["environment"]["RAGCACHE_API_KEY"] == "test-key"
    assert ragcache["environment"]["RAGCACHE_MILVUS_URI"] == "http://milvus:19530"
    assert {"etcd", "minio", "milvus"} <= set(services)
    for name, service in services.items():
        if name != "redis-cluster-init":  # a one-shot job, not a long-running service
            assert "healthcheck" in service, f"{name} has no health check"
    assert ragcache["depends_on"]["milvus"]["condition"] == "service_healthy"
    volumes = resolved(stack)["volumes"]
    for durable in ("etcd-data", "minio-data", "milvus-data"):
        assert durable in volumes


def test_single_stack_uses_one_redis_with_a_volume():
    services = resolved("single")["services"]
    assert services["ragcache"]["environment"]["RAGCACHE_REDIS_URL"] == "redis://redis:6379/0"
    assert any(volume.startswith("redis-data:") for volume in services["redis"]["volumes"])


def test_cluster_stack_has_six_nodes_and_a_one_shot_init():
    config = resolved("cluster")
    services = config["services"]
    nodes = sorted(name for name in services if name.startswith("redis-node-"))
    assert nodes == [f"redis-node-{i}" for i in range(1, 7)]
    conf = (DOCKER / "redis-cluster-node.conf").read_text()
    assert "cluster-enabled yes" in conf
    for name in nodes:
        assert any(v.startswith(f"{name}:") for v in services[name]["volumes"])
        assert "/usr/local/etc/redis/node.conf" in services[name]["command"]
    init = services["redis-cluster-init"]
    script = " ".join(init["command"])
    assert "--cluster create" in script and "--cluster-replicas 1" in script and "--cluster-yes" in script
    assert init["restart"] == "no"
    assert set(init["depends_on"]) == set(nodes)
    ragcache = services["ragcache"]
    assert ragcache["environment"]["RAGCACHE_REDIS_URL"] == "redis://redis-node-1:6379"
    assert ragcache["depends_on"]["redis-cluster-init"]["condition"] == "service_completed_successfully"


@pytest.mark.parametrize("stack", [name for name in STACKS if name.endswith("+monitoring")])
def test_monitoring_scrapes_the_service_and_provisions_grafana(stack):
    services = resolved(stack)["services"]
    prometheus, grafana = services["prometheus"], services["grafana"]
    # The key reaches Prometheus through the environment, never through a file in the repository.
    assert prometheus["environment"]["RAGCACHE_API_KEY"] == "test-key"
    assert "/prometheus/ragcache.key" in " ".join(prometheus["entrypoint"])
    sources = {volume.split(":")[1]: volume.split(":")[0] for volume in prometheus["volumes"] + grafana["volumes"]}
    assert sources["/etc/prometheus/prometheus.yml"] == str(DOCKER / "monitoring" / "prometheus.yml")
    for target in ("/etc/grafana/provisioning", "/var/lib/grafana/dashboards"):
        assert Path(sources[target]).is_dir(), target
    assert grafana["environment"]["GF_SECURITY_ADMIN_PASSWORD"] == "test-password"
    assert grafana["depends_on"]["prometheus"]["condition"] == "service_healthy"


def test_monitoring_refuses_to_start_without_a_grafana_password():
    env_without = {k: v for k, v in os.environ.items() if k != "GRAFANA_ADMIN_PASSWORD"}
    command = [shutil.which("docker-compose") or "docker-compose", "-f", str(DOCKER / "compose.yaml"),
               "-f", str(DOCKER / "compose.monitoring.yaml"), "config", "-q"]
    result = subprocess.run(command, capture_output=True, text=True, env={**env_without, "RAGCACHE_API_KEY": "k"}, timeout=120)
    assert result.returncode != 0 and "GRAFANA_ADMIN_PASSWORD" in result.stderr


def test_gpu_stack_reserves_gpus_and_enables_prefix_caching():
    services = resolved("gpu")["services"]
    for name in ("ragcache", "vllm"):
        devices = services[name]["deploy"]["resources"]["reservations"]["devices"]
        assert devices[0]["capabilities"] == ["gpu"]
    assert "--enable-prefix-caching" in services["vllm"]["command"]
    # Keep-warm reads cached tokens and sends its warms behind every user request.
    assert {"--enable-prompt-tokens-details", "--scheduling-policy=priority"} <= set(services["vllm"]["command"])
    assert services["ragcache"]["environment"]["RAGCACHE_DEVICE"] == "cuda"
    assert services["ragcache"]["build"]["dockerfile"].endswith("Dockerfile.cuda")
    assert "hf-cache" in resolved("gpu")["volumes"]


def test_lmcache_override_configures_the_connector_and_every_tier():
    services = resolved("gpu+lmcache")["services"]
    vllm = services["vllm"]
    command = vllm["command"]
    assert "--enable-prefix-caching" in command
    connector = command[command.index("--kv-transfer-config") + 1]
    assert '"kv_connector":"LMCacheConnectorV1"' in connector and '"kv_role":"kv_both"' in connector
    env = vllm["environment"]
    # The source document's settings: 256-token chunks, a CPU tier, a local disk tier, a remote tier, async loading.
    assert env["LMCACHE_CHUNK_SIZE"] == "256"
    assert env["LMCACHE_LOCAL_CPU"] == "True" and float(env["LMCACHE_MAX_LOCAL_CPU_SIZE"]) > 0
    disk = env["LMCACHE_LOCAL_DISK"]
    assert disk.startswith("file://") and float(env["LMCACHE_MAX_LOCAL_DISK_SIZE"]) > 0
    mounts = {volume.split(":")[1] for volume in vllm["volumes"]}
    assert disk.removeprefix("file://").rstrip("/") in mounts, "the disk tier must live on a volume"
    remote = env["LMCACHE_REMOTE_URL"]
    assert remote == "lm://lmcache-server:65432" and "lmcache-server" in services
    assert services["lmcache-server"]["entrypoint"][:1] == ["lmcache_server"]
    assert vllm["depends_on"]["lmcache-server"]["condition"] == "service_healthy"
    assert env["LMCACHE_ENABLE_ASYNC_LOADING"] == "True"
    assert vllm["deploy"]["resources"]["reservations"]["devices"], "the override must keep the GPU reservation"
    assert "lmcache-disk" in resolved("gpu+lmcache")["volumes"]


def test_every_lmcache_setting_is_documented():
    names = set(re.findall(r"\bLMCACHE_[A-Z_]+\b", (DOCKER / "compose.gpu.lmcache.yaml").read_text()))
    readme = (DOCKER / "README.md").read_text()
    assert len(names) >= 8
    assert not {name for name in names if f"`{name}`" not in readme}, "document each in docker/README.md"


def test_every_ragcache_variable_in_docker_files_is_a_setting():
    used: dict[str, set[str]] = {}
    for path in sorted(DOCKER.iterdir()):
        if path.is_file():
            for name in RAGCACHE_VARIABLE.findall(path.read_text()):
                used.setdefault(name, set()).add(path.name)
    for stack in STACKS:
        for service in resolved(stack)["services"].values():
            for name in service.get("environment", {}):
                if name.startswith("RAGCACHE_"):
                    used.setdefault(name, set()).add(stack)
    assert len(used) >= 6  # the files do configure the service by environment
    unknown = {name: sorted(where) for name, where in used.items() if name not in SETTING_NAMES}
    assert not unknown, f"not settings (ragcache.settings.Settings): {unknown}"


def test_dockerfiles_install_torch_first_then_the_project_constrained():
    for name in ("Dockerfile", "Dockerfile.cuda"):
        text = (DOCKER / name).read_text()
        torch_step = text.index("torch==${TORCH_VERSION}")
        project_step = text.index("pip install -c constraints.txt .")
        assert torch_step < project_step, name
        # The compiled loops are built in the image (a compiler for the install), and the build fails without them.
        assert text.index("gcc") < project_step < text.index("import ragcache.tiers._lru_kernels, ragcache_server._base64_answer")
        assert "ARG TORCH_VERSION=2.13.0" in text
        assert "HEALTHCHECK" in text and "/health" in text
    assert "download.pytorch.org/whl/cpu" in (DOCKER / "Dockerfile").read_text()
    assert "FROM ${CUDA_IMAGE}" in (DOCKER / "Dockerfile.cuda").read_text()
    assert "CUDA_IMAGE=nvidia/cuda:" in (DOCKER / "Dockerfile.cuda").read_text()


# Services that may publish a port on every interface: each refuses requests without its credentials.
CREDENTIALED = {"ragcache"}


@pytest.mark.parametrize("stack", list(STACKS))
def test_a_published_port_is_on_loopback_unless_its_service_carries_credentials(stack):
    """Issue 38, item 12: vLLM (no key) and Prometheus (no authentication, admin-only series) were published on every
    interface. Now Prometheus is not published, vLLM and Grafana only on the host's loopback, and only the service,
    whose compose files refuse to start without RAGCACHE_API_KEY, on every interface."""
    services = resolved(stack)["services"]
    assert "ports" not in services.get("prometheus", {}), "Prometheus has no authentication: never published"
    for name, service in services.items():
        for port in service.get("ports", []):
            if name in CREDENTIALED:
                assert service["environment"]["RAGCACHE_API_KEY"] == "test-key"
                continue
            assert host_ip_of(port) == "127.0.0.1", f"{name} publishes {port} beyond the host's loopback"
    assert {"ragcache", "redis", "milvus"} & set(services) and not {
        name for name in ("redis", "milvus", "etcd", "minio", "lmcache-server") if services.get(name, {}).get("ports")}


def host_ip_of(port: dict | str) -> str | None:
    """The host address a published port binds (None: every interface), in either of docker-compose's forms: the
    long one ({published, target, host_ip}) or, for a port with an address, "127.0.0.1:3000:3000/tcp"."""
    if isinstance(port, dict):
        return port.get("host_ip")
    parts = port.split("/")[0].split(":")
    return parts[0] if len(parts) == 3 else None


@pytest.mark.parametrize("stack", ["single", "gpu", "single+monitoring"])
def test_redis_keeps_an_append_only_file(stack):
    """The records without a TTL (prefixes, document versions, tenants' collections) are acknowledged writes: RDB
    snapshots alone (every 300 s) lost up to five minutes of them in a crash."""
    command = resolved(stack)["services"]["redis"]["command"]
    assert command[command.index("--appendonly") + 1] == "yes"
    assert command[command.index("--appendfsync") + 1] == "everysec"


def test_every_cluster_node_keeps_an_append_only_file():
    assert "appendonly yes" in (DOCKER / "redis-cluster-node.conf").read_text().splitlines()
