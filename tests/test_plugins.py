"""Kernels users bring: the worked example of docs/plugins.md through the whole pipeline,
from --plugin and from an entry point."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from nbx_tune.cli.app import app
from nbx_tune.errors import KernelError
from nbx_tune.kernels.runtime import certified, registry

ROOT = Path(__file__).resolve().parents[1]
PLUGIN_DIR = ROOT / "examples" / "plugin"
HEAD = "# nbx-tune trace v1\nop\tdtypes\tshapes\tparams\tcount\n"


@pytest.fixture
def on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(PLUGIN_DIR))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(PLUGIN_DIR), os.environ.get("PYTHONPATH", "")]))


def test_the_worked_example_goes_through_census_export_and_launch(tmp_path, db_url, on_path):
    t = tmp_path / "t.tsv"
    t.write_text(HEAD + "mylib.swiglu\tfloat32,float32\t37x29;37x29\t\t4\n"
                 "mylib.swiglu\tfloat16,float16\t999;998\t\t2\n"
                 "mylib.swiglu\tfloat32,float16\t5;5\t\t1\n")
    r = CliRunner().invoke(app, ["census", "--model", str(t), "--db", db_url, "--plugin", "nbx_swiglu", "--json"])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    assert rep["coverage"]["certified"]["seats"] == 1
    reasons = sorted(x["reason"] for x in rep["not_servable"])
    assert reasons == ["dtypes float32,float16: one of float16, bfloat16, float32",
                       "swiglu takes gate and up of one shape"]
    out = tmp_path / "table.json"
    r = CliRunner().invoke(app, ["export", "--profile", "interpreter", "-o", str(out), "--db", db_url,
                                 "--plugin", "nbx_swiglu"])
    assert r.exit_code == 0 and "wrote 1 certified" in r.stdout
    import nbx_swiglu

    certified.reload()
    g, u = torch.randn(37, 29), torch.randn(37, 29)
    got = nbx_swiglu.swiglu(g, u)
    ref = nbx_swiglu.swiglu_fp64(g.double().numpy(), u.double().numpy())
    assert np.abs(got.double().numpy() - ref).max() / np.abs(ref).max() < 1e-5
    assert certified.launch_stats()["misses"] == {}  # served the certified config


def test_an_entry_point_registers_a_kernel_without_flags(tmp_path):
    site = tmp_path / "site"
    dist = site / "nbx_swiglu_dist-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: nbx-swiglu-dist\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[nbx_tune.kernels]\nswiglu = nbx_swiglu:SPEC\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(PLUGIN_DIR), os.environ.get("PYTHONPATH", "")]), "TRITON_INTERPRET": "1"}
    code = "from nbx_tune.kernels.runtime.registry import spec_for_op; print(spec_for_op('mylib.swiglu').name)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "swiglu"


def test_a_plugin_cannot_take_an_op_another_kernel_serves(on_path):
    import nbx_swiglu

    class Thief(nbx_swiglu.SwiGLUSpec):
        name = "thief"
        ops = ("aten.mm",)

    registry.all_specs()
    with pytest.raises(KernelError, match="plugin kernel 'thief' .* claims op aten.mm, which the built-in kernel "
                                          "'matmul' serves"):
        registry.register(Thief(), "test")
    with pytest.raises(KernelError, match="plugin no_such_plugin: cannot import"):
        registry.load_plugin("no_such_plugin")


def test_the_docs_name_every_part_of_the_example():
    doc = (ROOT / "docs" / "plugins.md").read_text()
    src = (PLUGIN_DIR / "nbx_swiglu.py").read_text()
    for name in ("_swiglu", "launch_swiglu", "swiglu_fp64", "problem_from_row", "source_parts", "nbx_tune.kernels"):
        assert name in doc and (name in src or name == "nbx_tune.kernels")


def test_a_plugin_registered_before_the_built_ins_is_still_the_one_blamed(on_path, monkeypatch):
    import nbx_swiglu

    class Thief(nbx_swiglu.SwiGLUSpec):
        name = "thief"
        ops = ("aten.mm",)

    monkeypatch.setattr(registry, "_specs", {})
    monkeypatch.setattr(registry, "_by_op", {})
    monkeypatch.setattr(registry, "_loaded", False)
    registry.register(Thief(), "test")  # at its import, before anything loaded the built-ins
    with pytest.raises(KernelError, match="plugin kernel 'thief' .* claims op aten.mm"):
        registry.all_specs()


@pytest.mark.slow
def test_a_fresh_process_that_imports_a_plugin_gets_its_certified_configs(tmp_path, db_url, on_path):
    # Certified through --plugin; then a program that only imports the module and calls its
    # op (no entry point, no load_plugin) is served the certificate: the spec it hands
    # config_for is enough.
    t = tmp_path / "t.tsv"
    t.write_text(HEAD + "mylib.swiglu\tfloat32,float32\t37x29;37x29\t\t4\n")
    r = CliRunner().invoke(app, ["census", "--model", str(t), "--db", db_url, "--plugin", "nbx_swiglu"])
    assert r.exit_code == 0, r.output
    code = ("import logging, torch, nbx_swiglu\nfrom nbx_tune.kernels.runtime import certified\n"
            "logging.basicConfig(level=logging.INFO)\n"
            "nbx_swiglu.swiglu(torch.randn(37, 29), torch.randn(37, 29))\n"
            "print(certified.launch_stats()['misses'])")
    env = {**os.environ, "NBX_TUNE_DB": db_url, "TRITON_INTERPRET": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "{}", out.stderr  # no miss: the certified config was served
    assert "no such kernel" not in out.stderr and "no certified config" not in out.stderr


def test_a_config_space_declared_as_data_or_by_methods_reads_the_same(on_path):
    """Families declare `config_space`/`default_configs` as data; a plugin that computes
    them with `configs()`/`default_preference()`, as the worked example does, still works."""
    import nbx_swiglu
    from nbx_tune.kernels.rows import make_row
    from nbx_tune.kernels.spec import KernelSpec
    from nbx_tune.profiles import get_profile

    by_methods = nbx_swiglu.SwiGLUSpec()

    class ByData(nbx_swiglu.SwiGLUSpec):
        configs = KernelSpec.configs
        default_preference = KernelSpec.default_preference
        config_space = tuple(by_methods.configs())
        default_configs = tuple(by_methods.default_preference())

    by_data = ByData()
    assert "config_space" not in vars(nbx_swiglu.SwiGLUSpec)  # the example really uses methods
    assert by_data.configs() == by_methods.configs() and len(by_data.configs()) == 9
    assert by_data.config_space_hash == by_methods.config_space_hash
    profile = get_profile("interpreter")
    p = by_methods.problem_from_row(make_row("mylib.swiglu", ("float32", "float32"), ((7, 3), (7, 3))))
    assert by_data.default_config(profile, p) == by_methods.default_config(profile, p)
    assert by_data.default_config(profile, p)["BLOCK"] == 1024

    class Undeclared(KernelSpec):
        name = "undeclared"

    with pytest.raises(NotImplementedError, match="Undeclared declares no config_space"):
        Undeclared().configs()


def test_the_families_made_packages_are_built_in_not_plugins(monkeypatch):
    # A family's specs live in its package's spec.py (kernels/elementwise/spec.py): counted as a
    # plugin, every worker process would import it again by that name.
    monkeypatch.setattr(registry, "_specs", {})
    monkeypatch.setattr(registry, "_by_op", {})
    monkeypatch.setattr(registry, "_loaded", False)
    monkeypatch.setattr(registry, "_plugin_paths", set())
    modules = {type(s).__module__ for s in registry.all_specs().values()}
    assert "nbx_tune.kernels.elementwise.spec" in modules
    assert registry.plugin_modules() == []


def test_threads_asking_for_the_registry_at_once_each_see_all_of_it(monkeypatch):
    # A process of many worker threads (bench/fleet_sim.py's hosts): before, the first
    # thread marked the registry loaded before filling it, and the others, finding some
    # specs missing, took the queue's seats for unknown kernels and stopped.
    import threading

    import time

    def fresh():
        monkeypatch.setattr(registry, "_specs", {})
        monkeypatch.setattr(registry, "_by_op", {})
        monkeypatch.setattr(registry, "_loaded", False)
    fresh()
    want = set(registry.all_specs())
    fresh()
    slow = registry.register  # each spec takes a moment, as a first import does
    monkeypatch.setattr(registry, "register", lambda *a: time.sleep(0.005) or slow(*a))
    start, seen = threading.Barrier(8), []

    def ask():
        start.wait()
        seen.append(set(registry.all_specs()))
    threads = [threading.Thread(target=ask) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == [want] * 8
