"""gdnlab.runs: the committed registry matches its folders, and queries choose runs by their facts."""
import json

import pandas as pd
import pytest

from gdnlab import runs

DEVICES = sorted(p.name for p in runs.data_dir().parent.iterdir() if p.is_dir())


@pytest.mark.parametrize("device", DEVICES)
def test_registry_lists_every_folder_and_each_folder_holds_its_run(device):
    reg = runs.runs(device)
    folders = sorted(p.name for p in runs.data_dir(device).iterdir() if p.is_dir())
    assert sorted(reg.run_id) == folders and reg.run_id.is_unique
    assert set(reg.timing_method) <= set(runs.TIMING_METHODS)
    for r in reg.itertuples():
        d = runs.data_dir(device) / r.run_id
        assert r.run_id.startswith(r.utc_time.strftime("%Y-%m-%dT%H%M-")), r.run_id
        assert not [p for p in d.iterdir() if p.is_dir()], f"{r.run_id}: files sit directly in the run folder"
        env = json.loads((d / "env.json").read_text())
        assert (env["device"], env["torch"], env["triton"]) == (r.device, r.torch, r.triton), r.run_id
        if r.driver:
            assert r.driver in env["nvidia_smi"], r.run_id
        for csv in d.glob("*.csv"):  # rows stamped by a run carry that run's env date: no file mixes runs
            head = pd.read_csv(csv, nrows=0).columns
            if "date" in head:
                assert set(pd.read_csv(csv, usecols=["date"]).date) == {env["date"]}, f"{r.run_id}/{csv.name}"


def _registry(tmp_path, rows):
    d = tmp_path / "gpu"
    d.mkdir()
    pd.DataFrame([dict(dict.fromkeys(runs.COLUMNS, ""), **r) for r in rows]).to_csv(d / "RUNS.csv", index=False)
    for r in rows:
        (d / r["run_id"]).mkdir()
        (d / r["run_id"] / "bench.csv").write_text("backend,ms\nfast,1.0\n")
    return d


def test_latest_picks_by_time_and_filters(tmp_path, monkeypatch):
    d = _registry(tmp_path, [  # listed out of time order on purpose
        dict(run_id="b", utc_time="2026-01-02T00:00:00Z", purpose="bench: later", timing_method="synced"),
        dict(run_id="a", utc_time="2026-01-01T00:00:00Z", purpose="bench: earlier", timing_method="windows"),
        dict(run_id="c", utc_time="2026-01-03T00:00:00Z", purpose="variants: latest", timing_method="rounds")])
    (d / "a" / "host.csv").write_text("x\n1\n")
    monkeypatch.setattr(runs, "data_dir", lambda device="gpu": tmp_path / device)
    assert list(runs.runs("gpu").run_id) == ["a", "b", "c"]
    assert runs.latest("gpu", purpose="bench", has="bench.csv") == "b"
    assert runs.latest("gpu") == "c"
    assert runs.latest("gpu", has="host.csv") == "a"
    assert list(runs.select("gpu", purpose=("bench", "variants"), since="b").run_id) == ["b", "c"]
    assert list(runs.select("gpu", timing_method="windows").run_id) == ["a"]
    assert list(runs.select("gpu", before="b").run_id) == ["a"]
    assert runs.load("b", "bench.csv", "gpu").ms.tolist() == [1.0]
    with pytest.raises(runs.RunError, match="no gpu run with purpose 'conformance'"):
        runs.latest("gpu", purpose="conformance")


def test_errors_name_the_run_and_the_file(tmp_path, monkeypatch):
    _registry(tmp_path, [dict(run_id="a", utc_time="2026-01-01T00:00:00Z", purpose="bench: x")])
    monkeypatch.setattr(runs, "data_dir", lambda device="gpu": tmp_path / device)
    with pytest.raises(runs.RunError, match="run 'nope' is not in"):
        runs.path("nope", "bench.csv", "gpu")
    with pytest.raises(runs.RunError, match=r"run 'a' has no 'host.csv' \(it holds \['bench.csv'\]\)"):
        runs.load("a", "host.csv", "gpu")
    with pytest.raises(runs.RunError, match="no run registry for device 'tpu'"):
        runs.runs("tpu")
    assert runs.kind("bench: a: b") == "bench"


def test_file_run_copies_the_files_and_registers_the_run(tmp_path, monkeypatch):
    monkeypatch.setattr(runs, "data_dir", lambda device="gpu": tmp_path / device)
    src = tmp_path / "bench.csv"
    src.write_text("backend,ms\nfast,1.0\n")
    with pytest.raises(ValueError, match="env: must name torch, triton"):
        runs.file_run("gpu", "bench", "x", [src], dict(device="d"))
    rid = runs.file_run("gpu", "bench", "a test run", [src], dict(device="d", torch="t", triton="3"))
    assert runs.latest("gpu", purpose="bench", has="bench.csv") == rid
    row = runs.runs("gpu").iloc[-1]
    assert row.purpose == "bench: a test run" and row.timing_method == "none" and row.device == "d"
    env = json.loads((tmp_path / "gpu" / rid / "env.json").read_text())
    assert env["torch"] == "t" and env["date"].startswith(row.utc_time.strftime("%Y-%m-%dT%H:%M"))
    assert runs.load(rid, "bench.csv", "gpu").ms.tolist() == [1.0]


def test_file_run_names_a_run_filed_later_by_its_start(tmp_path, monkeypatch):
    monkeypatch.setattr(runs, "data_dir", lambda device="gpu": tmp_path / device)
    src = tmp_path / "host.csv"
    src.write_text("backend,us\nfast,1.0\n")
    rid = runs.file_run("gpu", "host", "late", [src], dict(device="d", torch="t", triton="3"),
                        started="2026-01-02T03:04:05Z")
    assert rid == "2026-01-02T0304-host"
    assert str(runs.runs("gpu").iloc[-1].utc_time) == "2026-01-02 03:04:05+00:00"


def test_a_run_split_over_calls_is_read_back_as_its_chain(tmp_path, monkeypatch):
    monkeypatch.setattr(runs, "data_dir", lambda device="gpu": tmp_path / device)
    src = tmp_path / "bench.csv"
    src.write_text("backend,ms\nfast,1.0\n")
    env = dict(device="d", torch="t", triton="3")
    a = runs.file_run("gpu", "field", "first call", [src], env, started="2026-01-02T03:04:05Z", commit="abc1234")
    b = runs.file_run("gpu", "field", "second call", [src], {**env, "continues": a}, started="2026-01-02T03:10:00Z")
    assert runs.continued(b, "gpu") == [a, b] and runs.continued(a, "gpu") == [a]
    assert runs.load_chain(b, "bench.csv", "gpu").run_id.tolist() == [a, b]
    assert runs.runs("gpu").set_index("run_id").commit[a] == "abc1234"
    conf = tmp_path / "conformance.csv"
    conf.write_text("case,backend\nc1,fast\n")
    c = runs.file_run("gpu", "field", "third call", [conf], {**env, "continues": b}, started="2026-01-02T03:20:00Z")
    assert runs.load_chain(c, "bench.csv", "gpu").run_id.tolist() == [a, b]  # the call without a bench is skipped
    assert runs.load_chain(c, "conformance.csv", "gpu").run_id.tolist() == [c]
    with pytest.raises(runs.RunError, match="holds 'sweep.csv'"):
        runs.load_chain(c, "sweep.csv", "gpu")
    # several names: each run's first that it holds (a bench cut short wrote bench_log.csv)
    assert runs.load_chain(c, ("sweep.csv", "conformance.csv"), "gpu").run_id.tolist() == [c]
    assert runs.load_chain(c, ("bench_log.csv", "bench.csv"), "gpu").run_id.tolist() == [a, b]
    (tmp_path / "gpu" / a / "env.json").write_text(json.dumps({**env, "continues": b}))
    with pytest.raises(runs.RunError, match="loops"):
        runs.continued(b, "gpu")
