"""Per-test settings: marker > command line > environment > ini file > spec file > default.

One pytester run per precedence pair, for each setting that has that pair: which value won, and
that the source string names it. The probe test reads the settings preflight stashed and the
plan ``moeperf.plan()`` builds from them (the value really applied, not only resolved). Then one
run per misuse: a bad value from each source is one line naming that source, in preflight,
before any server starts (the guard conftest fails loudly if one was about to).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from preflight_helpers import GUARD, SPEC, one_error_line, run_perf_test

pytest_plugins = ["pytester"]

#: Every variable these tests set or rely on being unset.
ENV = ("MOEPERF_RUNS", "MOEPERF_QUICK", "MOEPERF_SPECS_DIR", "MOEPERF_MODELS_DIR")

#: Markers from line 7 on; reads the stashed settings and the plan, starts nothing.
PROBE = """\
from pathlib import Path

import pytest
from pytest_moeperf import settings


{markers}
def test_probe(moeperf):
    s = settings.of(moeperf.item)
    plan = moeperf.plan()
    for name in ("runs", "slo", "specs_dir", "models_dir"):
        r = getattr(s, name)
        print(f"SETTING {{name}} = {{r.value!r}} FROM {{r.source}}")
    print(f"PLAN runs={{plan.runs}} spec={{plan.spec.source}}")
    print(f"PLAN slo_source={{plan.slo_source}}")
    if plan.spec.model.path != "embedded":
        print(f"PLAN model_dir={{moeperf.model_dir(plan.spec)}}")
"""

SPEC_NO_RUNS = SPEC.replace("runs: 1\n", "")
SPEC_RUNS_LINE = SPEC.splitlines().index("runs: 1") + 1


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENV:
        monkeypatch.delenv(name, raising=False)


def _probe(pytester: pytest.Pytester, markers: str = '@pytest.mark.moeperf_spec("spec.yaml")',
           *args: str, ini: str = "", spec: str = SPEC) -> dict[str, str]:  # fmt: skip
    """Run the probe; ``{"runs": "5 FROM <source>", ..., "plan": "runs=5 spec=..."}``."""
    pytester.makeconftest(GUARD)
    if ini:
        pytester.makeini("[pytest]\n" + ini)
    if not (pytester.path / "spec.yaml").exists():
        (pytester.path / "spec.yaml").write_text(spec)
    pytester.makepyfile(test_probe=PROBE.format(markers=markers))
    result = pytester.runpytest_subprocess("-s", "-p", "no:cacheprovider", *args)
    out = result.stdout.str()
    assert "SERVER WOULD START" not in out, out
    result.assert_outcomes(passed=1)
    got: dict[str, str] = {}
    for line in result.outlines:  # -s: the first line follows "test_probe.py "
        m = re.search(r"SETTING (\w+) = (.*)$", line)
        if m:
            got[m[1]] = m[2]
        m = re.search(r"PLAN (\w+)=(.*)$", line)
        if m:
            got[f"plan_{m[1]}"] = m[2]
    return got


# -- runs: marker > command line > environment > ini file > spec file > default --------------------
def test_marker_beats_the_command_line(pytester: pytest.Pytester,
                                       monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """The bug of issue 19: --moeperf-runs used to beat moeperf_spec(runs=...)."""
    monkeypatch.setenv("MOEPERF_RUNS", "6")
    got = _probe(pytester, '@pytest.mark.moeperf_spec("spec.yaml", runs=5)', "--moeperf-runs",
                 "8", ini="moeperf_runs = 4\n")  # fmt: skip
    assert got["runs"] == "5 FROM marker @pytest.mark.moeperf_spec on test_probe.py:7 (test_probe)"
    assert got["plan_runs"].startswith("5 ")


def test_command_line_beats_the_environment(pytester: pytest.Pytester,
                                            monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setenv("MOEPERF_RUNS", "6")
    got = _probe(pytester, '@pytest.mark.moeperf_spec("spec.yaml")', "--moeperf-runs", "8",
                 ini="moeperf_runs = 4\n")  # fmt: skip
    assert got["runs"] == "8 FROM command line --moeperf-runs"
    assert got["plan_runs"].startswith("8 ")


def test_environment_beats_the_ini_file(pytester: pytest.Pytester,
                                        monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setenv("MOEPERF_RUNS", "6")
    got = _probe(pytester, ini="moeperf_runs = 4\n")
    assert got["runs"] == "6 FROM environment variable MOEPERF_RUNS"
    assert got["plan_runs"].startswith("6 ")


def test_ini_file_beats_the_spec_file(pytester: pytest.Pytester) -> None:
    got = _probe(pytester, ini="moeperf_runs = 4\n", spec=SPEC.replace("runs: 1", "runs: 2"))
    assert got["runs"] == f"4 FROM ini option moeperf_runs ({pytester.path / 'tox.ini'})"
    assert got["plan_runs"].startswith("4 ")


def test_spec_file_beats_the_default(pytester: pytest.Pytester) -> None:
    got = _probe(pytester, spec=SPEC.replace("runs: 1", "runs: 2"))
    spec = pytester.path / "spec.yaml"
    assert got["runs"] == f"2 FROM spec file {spec}:{SPEC_RUNS_LINE}"
    assert got["plan_runs"] == f"2 spec={spec}"


def test_default_when_nothing_sets_runs(pytester: pytest.Pytester) -> None:
    got = _probe(pytester, spec=SPEC_NO_RUNS)
    assert got["runs"] == f"3 FROM default (no runs: in spec file {pytester.path / 'spec.yaml'})"
    assert got["plan_runs"].startswith("3 ")


def test_quick_mode_measures_one_run_whatever_the_source(pytester: pytest.Pytester) -> None:
    got = _probe(pytester, '@pytest.mark.moeperf_spec("spec.yaml", runs=5)', "--moeperf-quick")
    assert got["runs"].startswith("5 FROM marker @pytest.mark.moeperf_spec")
    assert got["plan_runs"].startswith("1 ")


# -- slo: marker > spec file ----------------------------------------------------------------------
def test_slo_marker_beats_the_spec_file(pytester: pytest.Pytester) -> None:
    marks = ('@pytest.mark.moeperf_spec("spec.yaml")\n'
             "@pytest.mark.moeperf_slo(ttft_p99_ms=111, tpot_p99_ms=22)")  # fmt: skip
    got = _probe(pytester, marks)
    assert "ttft_p99_ms=111.0, tpot_p99_ms=22.0" in got["slo"]
    marker = "marker @pytest.mark.moeperf_slo on test_probe.py:8 (test_probe)"
    assert got["slo"].endswith(f"FROM {marker}")
    assert got["plan_slo_source"] == marker


def test_slo_of_the_spec_file_without_a_marker(pytester: pytest.Pytester) -> None:
    got = _probe(pytester)
    assert "ttft_p99_ms=2000" in got["slo"]
    assert got["slo"].endswith(f"FROM spec {pytester.path / 'spec.yaml'}")


# -- the specs and models folders: command line > environment > ini file > default ----------------
FOLDERS = {  # setting -> (flag, variable, ini key)
    "specs_dir": ("--moeperf-specs-dir", "MOEPERF_SPECS_DIR", "moeperf_specs_dir"),
    "models_dir": ("--moeperf-models-dir", "MOEPERF_MODELS_DIR", "moeperf_models_dir"),
}
SPEC_MARK = '@pytest.mark.moeperf_spec("shared.yaml")'


def _folders(pytester: pytest.Pytester, *names: str) -> None:
    """Folders ``cli``, ``env``, ``ini`` and ``perf_tests/specs`` + ``perf_tests/models``, each a
    specs folder with ``shared.yaml`` (a spec whose bare model name is ``tiny-model``) and a
    models folder holding ``tiny-model``, so the folder that won is the one the plan reads."""
    spec = SPEC.replace("path: embedded", "path: tiny-model")
    for name in (*names, "perf_tests/specs", "perf_tests/models"):
        folder = pytester.path / name
        (folder / "tiny-model").mkdir(parents=True)
        (folder / "shared.yaml").write_text(spec)


def _applied(got: dict[str, str], which: str, folder: Path) -> None:
    """The plan read the spec from, or took the model from, the folder that won."""
    if which == "specs_dir":
        assert got["plan_runs"].endswith(f"spec={folder / 'shared.yaml'}")
    else:
        assert got["plan_model_dir"] == str(folder / "tiny-model")


@pytest.mark.parametrize("which", sorted(FOLDERS))
def test_folder_command_line_beats_the_environment(pytester: pytest.Pytester,
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   which: str) -> None:  # fmt: skip
    flag, var, ini = FOLDERS[which]
    _folders(pytester, "cli", "env", "ini")
    monkeypatch.setenv(var, "env")
    got = _probe(pytester, SPEC_MARK, flag, "cli", ini=f"{ini} = ini\n")
    assert got[which] == f"PosixPath({str(pytester.path / 'cli')!r}) FROM command line {flag}"
    _applied(got, which, pytester.path / "cli")


@pytest.mark.parametrize("which", sorted(FOLDERS))
def test_folder_environment_beats_the_ini_file(pytester: pytest.Pytester,
                                               monkeypatch: pytest.MonkeyPatch,
                                               which: str) -> None:  # fmt: skip
    _, var, ini = FOLDERS[which]
    _folders(pytester, "env", "ini")
    monkeypatch.setenv(var, "env")
    got = _probe(pytester, SPEC_MARK, ini=f"{ini} = ini\n")
    env = pytester.path / "env"
    assert got[which] == f"PosixPath({str(env)!r}) FROM environment variable {var}"
    _applied(got, which, pytester.path / "env")


@pytest.mark.parametrize("which", sorted(FOLDERS))
def test_folder_ini_file_beats_the_default(pytester: pytest.Pytester, which: str) -> None:
    _, _, ini = FOLDERS[which]
    _folders(pytester, "ini")
    got = _probe(pytester, SPEC_MARK, ini=f"{ini} = ini\n")
    tox = pytester.path / "tox.ini"
    assert got[which] == f"PosixPath({str(pytester.path / 'ini')!r}) FROM ini option {ini} ({tox})"
    _applied(got, which, pytester.path / "ini")


@pytest.mark.parametrize("which", sorted(FOLDERS))
def test_folder_default_is_under_the_rootdir(pytester: pytest.Pytester, which: str) -> None:
    _folders(pytester)
    got = _probe(pytester, SPEC_MARK)
    default = pytester.path / "perf_tests" / which.removesuffix("_dir")
    assert got[which] == f"PosixPath({str(default)!r}) FROM default"
    _applied(got, which, default)


# -- misuse: one line naming the source, in preflight ---------------------------------------------
def _bad(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, source: str, var: str,
         text: str, markers: str = '@pytest.mark.moeperf_spec("spec.yaml")',
         spec: str = SPEC) -> pytest.RunResult:  # fmt: skip
    """Set ``text`` for setting ``var`` (its env name) from ``source`` and run the perf test."""
    name = var.lower()
    flag = "--" + name.replace("_", "-")
    args: tuple[str, ...] = ()
    if source == "command line":
        args = (flag, text)
    elif source == "environment":
        monkeypatch.setenv(var, text)
    elif source == "ini file":
        pytester.makeini(f"[pytest]\n{name} = {text}\n")
    return run_perf_test(pytester, markers, spec, args)


BAD_RUNS = {
    "command line": ("zero", "command line --moeperf-runs: moeperf_runs = 'zero': must be an "
                     "integer >= 1"),
    "environment": ("-1", "environment variable MOEPERF_RUNS: moeperf_runs = '-1': must be an "
                    "integer >= 1"),
    "ini file": ("many", "ini option moeperf_runs ({ini}): moeperf_runs = 'many': must be an "
                 "integer >= 1"),
}  # fmt: skip


@pytest.mark.parametrize("source", sorted(BAD_RUNS))
def test_bad_runs_names_its_source(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
                                   source: str) -> None:  # fmt: skip
    text, needle = BAD_RUNS[source]
    result = _bad(pytester, monkeypatch, source, "MOEPERF_RUNS", text)
    line = one_error_line(result, needle.format(ini=pytester.path / "tox.ini"))
    assert "Fix: set a valid value for --moeperf-runs / MOEPERF_RUNS / moeperf_runs" in line


def test_bad_runs_from_the_marker_names_the_marker(pytester: pytest.Pytester) -> None:
    result = run_perf_test(pytester, '@pytest.mark.moeperf_spec("spec.yaml", runs=0)')
    one_error_line(result, "marker @pytest.mark.moeperf_spec on test_it.py:6 (test_it): runs = 0: "
                   "must be an integer >= 1")  # fmt: skip


def test_bad_runs_from_the_spec_file_names_its_line(pytester: pytest.Pytester) -> None:
    result = run_perf_test(pytester, '@pytest.mark.moeperf_spec("spec.yaml")',
                           SPEC.replace("runs: 1", "runs: 0"))  # fmt: skip
    one_error_line(result, f"spec.yaml:{SPEC_RUNS_LINE}: runs = 0: must be >= 1")


def test_a_bad_value_a_marker_shadows_is_still_refused(pytester: pytest.Pytester) -> None:
    """The marker wins for this test, but --moeperf-runs zero applies to the session's others."""
    result = run_perf_test(pytester, '@pytest.mark.moeperf_spec("spec.yaml", runs=5)',
                           args=("--moeperf-runs", "zero"))  # fmt: skip
    one_error_line(result, "command line --moeperf-runs: moeperf_runs = 'zero'")


@pytest.mark.parametrize("var", ["MOEPERF_SPECS_DIR", "MOEPERF_MODELS_DIR"])
@pytest.mark.parametrize("source", ["command line", "environment", "ini file"])
def test_a_folder_that_does_not_exist_names_its_source(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, source: str, var: str
) -> None:
    name = var.lower()
    flag = "--" + name.replace("_", "-")
    result = _bad(pytester, monkeypatch, source, var, "no/such")
    where = {"command line": f"command line {flag}", "environment": f"environment variable {var}",
             "ini file": f"ini option {name} ({pytester.path / 'tox.ini'})"}[source]  # fmt: skip
    knob = {"command line": flag, "environment": var, "ini file": name}[source]
    line = one_error_line(result, f"{where}: {name} = 'no/such': no such folder "
                          f"({pytester.path / 'no' / 'such'})")  # fmt: skip
    assert (f"Fix: point {knob} at an existing folder (a relative path is taken from the rootdir "
            f"{pytester.path}), or unset it for the default perf_tests/") in line  # fmt: skip


def test_a_folder_setting_naming_a_file(pytester: pytest.Pytester,
                                        monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    (pytester.path / "afile").write_text("")
    result = _bad(pytester, monkeypatch, "environment", "MOEPERF_SPECS_DIR", "afile")
    one_error_line(result, "environment variable MOEPERF_SPECS_DIR: moeperf_specs_dir = 'afile': "
                   f"is not a folder ({pytester.path / 'afile'})")  # fmt: skip


def test_an_empty_folder_on_the_command_line(pytester: pytest.Pytester,
                                             monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    result = _bad(pytester, monkeypatch, "command line", "MOEPERF_MODELS_DIR", "")
    one_error_line(result, "command line --moeperf-models-dir: moeperf_models_dir = '': is empty")


def test_a_bad_specs_folder_stops_a_test_that_starts_no_server(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A helper test with a spec marker looks the spec up too, so the folder is checked for it."""
    monkeypatch.setenv("MOEPERF_SPECS_DIR", "gone")
    (pytester.path / "spec.yaml").write_text(SPEC)
    pytester.makepyfile(test_plain='import pytest\n\n@pytest.mark.moeperf_spec("spec.yaml")\n'
                        "def test_it():\n    pass\n")  # fmt: skip
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    want = ("*environment variable MOEPERF_SPECS_DIR: moeperf_specs_dir = 'gone': no such folder"
            "*Fix: point MOEPERF_SPECS_DIR at*")  # fmt: skip
    result.stdout.fnmatch_lines([want])
