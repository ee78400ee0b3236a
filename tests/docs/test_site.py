"""The documentation site never drifts from the code: it builds in strict mode (a broken link, a
missing snippet or a reference to a missing name fails), every public name has a reference
entry, and every code block in it is either included from a file the tests run or says why not."""

from __future__ import annotations

import ast
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PUBLIC = {  # module -> its file, whose __all__ lists the public names
    "raytf": "raytf/__init__.py", "raytf.keras": "raytf/keras/__init__.py", "raytf.data": "raytf/data.py",
    "raytf.train": "raytf/train/__init__.py", "raytf.train.keras": "raytf/train/keras.py",
}
# Files whose code the test suite runs: blocks included from them need no mark.
TESTED = ("jobs/", "docs/examples/", "cluster/")
FENCE = re.compile(r"^(\s*)```(\w*)\s*$")


def pages() -> list[pathlib.Path]:
    return sorted(p for p in DOCS.rglob("*.md") if not {"_hooks", "examples"} & set(p.relative_to(DOCS).parts))


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> pathlib.Path:
    """The site, built as the docs' own command builds it (strict mode); a failed build fails here."""
    site = tmp_path_factory.mktemp("site")
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-6000:]
    return site


def test_the_site_builds_in_strict_mode(site):
    for chart in ("recovery", "w3_pause", "file_ingest"):  # drawn from bench/results by the build
        assert (site / "charts" / f"{chart}.svg").read_text().lstrip().startswith("<?xml")
    errors = (site / "reference" / "errors" / "index.html").read_text()
    assert "must be one of" in errors and "raytf/config.py" in errors  # the messages, read off the code
    # The support table is CI's matrix: the oldest pins of noxfile.py and the bounds of pyproject.toml.
    support = (site / "reference" / "support" / "index.html").read_text()
    pins = re.findall(r'"(tensorflow|keras|tf-keras|ray\[default,data\])==([\d.]+)"', (ROOT / "noxfile.py").read_text())
    assert len(pins) == 4 and all(f"<td>{version}</td>" in support for _, version in pins), pins
    assert "&gt;=3.11" in support


def test_a_broken_link_or_a_missing_name_fails_the_build(tmp_path):
    """The site's own settings (mkdocs.yml) turn a link to a missing page and a reference to a
    missing name into errors: the same docs, the first page with a broken link and a later one with
    a missing name, built once as the test above builds (the link is checked as its page renders,
    before the later page's missing name stops the build; under --strict its warning alone fails it)."""
    import shutil

    shutil.copytree(DOCS, tmp_path / "docs")
    config = (ROOT / "mkdocs.yml").read_text().replace("docs/_hooks/generate.py", str(DOCS / "_hooks" / "generate.py"))
    (tmp_path / "mkdocs.yml").write_text(config + f"\ndocs_dir: {tmp_path / 'docs'}\n")
    for page, broken in (("index.md", "[gone](no-such-page.md)"), ("concepts/index.md", "::: raytf.NoSuchTrainer")):
        (tmp_path / "docs" / page).write_text((DOCS / page).read_text() + f"\n{broken}\n")
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(tmp_path / "mkdocs.yml"),
         "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    said = built.stdout + built.stderr
    assert built.returncode != 0 and "Could not collect 'raytf.NoSuchTrainer'" in said, said[-2000:]
    # The link was said as a warning, which --strict turns into the build's failure on its own.
    [link] = [line for line in said.splitlines() if "no-such-page.md" in line]
    assert link.startswith(("WARNING", "ERROR")), link


def public_names() -> list[str]:
    names = []
    for module, path in PUBLIC.items():
        tree = ast.parse((ROOT / path).read_text())
        listed = next(node.value for node in tree.body if isinstance(node, ast.Assign)
                      and any(getattr(t, "id", "") == "__all__" for t in node.targets))
        names += [f"{module}.{ast.literal_eval(e)}" for e in listed.elts]
    return names


def test_every_public_name_has_an_entry_in_the_reference():
    entries = set(re.findall(r"^::: ([\w.]+)\s*$", "\n".join(p.read_text() for p in (DOCS / "reference").glob("*.md")),
                             re.MULTILINE))
    missing = [name for name in public_names() if name not in entries]
    assert not missing, f"public names with no '::: name' in docs/reference/: {missing}"


def blocks(path: pathlib.Path):
    """(line number, language, the block's lines, the nearest non-blank line above it)."""
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        opened = FENCE.match(lines[i])
        if not opened:
            i += 1
            continue
        end = next(k for k in range(i + 1, len(lines)) if lines[k].strip() == "```")
        above = next((lines[k].strip() for k in range(i - 1, -1, -1) if lines[k].strip()), "")
        yield i + 1, opened.group(2), lines[i + 1:end], above
        i = end + 1


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(DOCS)))
def test_every_code_block_is_run_by_the_tests_or_says_why_not(page):
    for line, language, body, above in blocks(page):
        if language in ("text", "mermaid"):
            continue  # a program's output; a diagram
        included = [b.strip() for b in body if b.strip()]
        if len(included) == 1 and included[0].startswith("--8<--"):
            target = included[0].split('"')[1].split(":")[0]
            assert target.startswith(TESTED) and (ROOT / target).exists(), f"{page.name}:{line}: {target}"
            continue
        assert re.match(r"<!-- not run[^:]*: \S.* -->$", above), (
            f"{page.relative_to(ROOT)}:{line}: a {language or 'plain'} block neither included from a tested file "
            "(--8<-- \"jobs/... or docs/examples/...:section\") nor marked <!-- not run: the reason --> above it")


def test_every_example_the_docs_quote_is_run_by_a_test():
    runner = "\n".join(p.read_text() for p in (ROOT / "tests").rglob("test_*.py"))
    for example in sorted((DOCS / "examples").glob("*.py")):
        assert f'example("{example.stem}")' in runner, f"docs/examples/{example.name} is not run"


# A benchmark result typed in prose: a decimal with a unit or a ratio's x, or a rate of rows or samples.
TYPED_FIGURE = re.compile(r"(?<![\w.])\d[\d,]*\.\d+(?:-\d[\d,]*\.\d+)? ?(?:x\b|×| s\b| GiB\b| MiB\b)|\d[\d,]{3,} (?:rows|samples)/s")


# How a figure reads before its marker: a median and its range, a range, or one value.
FIGURE_TYPED = r"(\d[\d,.]* \(\d[\d,.]*-\d[\d,.]*\)|\d[\d,.]*-\d[\d,.]*|\d[\d,.]*)"


def readme_figures(readme: str):
    """(the figure typed before each raytf:figure marker, what the marker's record gives) in the README."""
    sys.path.insert(0, str(DOCS / "_hooks"))
    try:
        import generate
        import records
    finally:
        sys.path.remove(str(DOCS / "_hooks"))
    for found in generate.FIGURE.finditer(readme):
        typed = re.search(FIGURE_TYPED + r"(?:x|×)?$", readme[:found.start()])
        yield (typed.group(1) if typed else ""), records.figure(str(ROOT), *(g or "" for g in found.groups()))


def test_every_figure_in_the_readme_is_what_its_record_says():
    """The README cannot be rendered at build time as the site is: each benchmark figure in it is
    typed with a ``<!-- raytf:figure:... -->`` marker right after it, naming the record and the
    value (docs/_hooks/records.py: figure), and this test holds the figure to that record (a new
    run fails it until the README says what the run measured). A figure with no marker fails it."""
    readme = (ROOT / "README.md").read_text()
    checked = list(readme_figures(readme))
    assert len(checked) >= 8, checked
    assert all(typed == expected for typed, expected in checked), [c for c in checked if c[0] != c[1]]
    unmarked = unmarked_figures(readme)
    assert not unmarked, f"README figures with no raytf:figure marker naming their record: {unmarked}"


def unmarked_figures(text: str) -> list[str]:
    """The typed benchmark figures of ``text`` that no raytf:figure marker follows (code blocks
    aside). A table a record renders is a marker in the page's source, so a table row written
    there by hand is held to this like a sentence."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(FIGURE_TYPED + r"(?:x|×)?<!-- raytf:figure:[^>]*-->", "", text)
    return [m.group(0) for line in text.splitlines() for m in TYPED_FIGURE.finditer(line)]


@pytest.mark.parametrize("page", [p for p in pages() if p.name != "changelog.md"], ids=lambda p: str(p.relative_to(DOCS)))
def test_no_page_types_a_benchmark_figure(page):
    """A page's benchmark figures are rendered from records (a table's ``raytf:bench`` or
    ``raytf:kept`` marker, a sentence's ``raytf:figure``), never typed, so that none outlives the
    run it came from. A program's output quoted in code is not a figure; the changelog (not
    checked) says what each release changed in the words of its day."""
    assert not unmarked_figures(re.sub(r"`[^`]+`", "", page.read_text())), page


def test_the_readme_is_a_front_page_that_starts_with_the_two_commands_and_links_into_the_site(tmp_path):
    readme = (ROOT / "README.md").read_text()
    first = next(i for i, line in enumerate(readme.splitlines()) if FENCE.match(line))
    commands = readme.splitlines()[first + 1:first + 3]
    assert commands == ['pip install -e . && python jobs/train_mlp.py', 'pip install -e ".[test]" && python -m pytest']
    # CI runs the test command verbatim, then the oldest versions' tiers (noxfile.py), whether the
    # first passed or not, and fails with the first failure's status: run with each of the two
    # commands standing in for a run that passes or fails.
    ci = (ROOT / ".ci" / "run").read_text()
    [test_line] = [line for line in ci.splitlines() if line.startswith(commands[1])]
    assert ci.count("python -m nox -s oldest") == 1 and ci.index(test_line) < ci.index("python -m nox -s oldest")
    (tmp_path / ".ci").mkdir()
    for newest, oldest, status in ((0, 0, 0), (1, 0, 1), (0, 3, 3), (2, 3, 2)):
        (tmp_path / ".ci" / "run").write_text(ci.replace(commands[1], f"echo newest; (exit {newest})")
                                              .replace("python -m nox -s oldest", f"echo oldest; (exit {oldest})"))
        done = subprocess.run(["bash", str(tmp_path / ".ci" / "run")], capture_output=True, text=True, timeout=60)
        assert (done.returncode, done.stdout.split()) == (status, ["newest", "oldest"]), (newest, oldest, done)
    links = re.findall(r"\]\((docs/[^)#]+)", readme)
    assert len(links) >= 8, links
    for link in links:
        assert (ROOT / link).exists(), link
    assert len(readme.splitlines()) < 200, "the README is a front page; what it explains lives in docs/"


def test_the_contributing_page_shows_the_newest_passing_run_of_the_whole_suite(tmp_path, monkeypatch):
    """The slowest tests on docs/contributing.md come from the newest kept record of a whole,
    passing run (``--suite-record``), never from a partial or failed one, nor typed by hand."""
    import json

    monkeypatch.syspath_prepend(str(DOCS / "_hooks"))
    import reference

    record = tmp_path / "tests" / "records" / "suite.jsonl"
    record.parent.mkdir(parents=True)

    def run(when, status, args, tests):
        return {"when": when, "commit": "abc1234", "wall_s": 600.0, "exit_status": status, "args": args,
                "outcomes": {"passed": len(tests)}, "machine": {"cpus": 2, "memory_gib": 24, "python": "3.11.7"},
                "versions": {"tensorflow": "2.21.0", "keras": "3.15.1", "ray": "2.60.0"},
                "tests_s": {f"tests/x.py::{name}@x": took for name, took in tests}}

    slow = [(f"test_{i}", 100.0 - i) for i in range(12)]
    lines = [run("2026-11-26T10:00:00Z", 0, [], slow), run("2026-11-27T10:00:00Z", 0, ["-m", "unit"], [("u", 1.0)]),
             run("2026-11-27T11:00:00Z", 1, [], [("failed", 500.0)])]
    record.write_text("".join(json.dumps(line) + "\n" for line in lines))
    page = reference.slowest_markdown(str(tmp_path))
    assert "2026-11-26" in page and "12 tests in 10.0 minutes on 2 CPUs" in page
    rows = [line for line in page.splitlines() if line.startswith("| ") and "`" in line]
    assert [row.split("`")[1] for row in rows] == [f"tests/x.py::test_{i}" for i in range(10)]
    assert "failed" not in page and "::u`" not in page
    # A record with CPU-seconds (tests/cpu.py) shows the costliest by CPU first, then the slowest.
    with_cpu = run("2026-11-28T10:00:00Z", 0, [], slow)
    with_cpu["tests_cpu_s"] = {f"tests/x.py::test_{i}@x": 50.0 + i for i in reversed(range(12))}
    with_cpu["machine_cpu_s"] = 1080.0
    record.write_text(record.read_text() + json.dumps(with_cpu) + "\n")
    page = reference.slowest_markdown(str(tmp_path))
    assert "busy for 18.0 CPU-minutes of it (90% of all they had)" in page
    costly, slowest = page.split("Its ten slowest tests:")
    rows = [line for line in costly.splitlines() if line.startswith("| ") and "`" in line]
    assert [row.split("`")[1] for row in rows] == [f"tests/x.py::test_{i}" for i in reversed(range(2, 12))]
    assert rows[0].startswith("| 61 | 89 |")  # its CPU-seconds, then its seconds
    assert "test_0`" in slowest and "used 11.1 CPU-minutes" in costly
    # A record with the TrainWorker processes each integration test started shows them too.
    with_starts = dict(with_cpu, tests_s={f"tests/integration/x.py::{name}@x": took for name, took in slow},
                       tests_cpu_s={f"tests/integration/x.py::test_{i}@x": 50.0 + i for i in reversed(range(12))},
                       worker_starts={f"tests/integration/x.py::test_{i}@x": i for i in reversed(range(1, 12))})
    record.write_text(record.read_text() + json.dumps(with_starts) + "\n")
    page = reference.slowest_markdown(str(tmp_path))
    assert "| CPU-seconds | Seconds | Workers started | Test |" in page
    assert "| 61 | 89 | 11 | `tests/integration/x.py::test_11` |" in page
    # 666 CPU-seconds over 66 worker processes.
    assert "started 66 TrainWorker processes (standbys included) and used 11.1 CPU-minutes: 10.1 CPU-seconds" in page
    # A record of when each test ran, and in which process, shows how the processes shared the run.
    with_schedule = dict(with_starts, ran_at={"tests/a.py::t1@a": ["gw0", 1.0, 300.0], "tests/a.py::t2@a": ["gw0", 300.0, 590.5],
                                              "tests/b.py::t@b": ["gw1", 2.0, 420.0], "tests/c.py::t@c": ["gw1", 420.0, 450.0]})
    record.write_text(record.read_text() + json.dumps(with_schedule) + "\n")
    page = reference.slowest_markdown(str(tmp_path))
    assert ("How its pytest processes shared the 600 s: gw0 ran 1 test file, its last test ending at 590 s; "
            "gw1 ran 2 test files, its last test ending at 450 s.") in page
    # A record of the machine's processor and its host's counters names them.
    with_host = dict(with_schedule, machine={**with_schedule["machine"], "cpu_model": "AMD EPYC"},
                     host={"steal_s": 12.4, "refaulted_file_mib": 2345.6})
    record.write_text(record.read_text() + json.dumps(with_host) + "\n")
    page = reference.slowest_markdown(str(tmp_path))
    assert "12 tests in 10.0 minutes on 2 CPUs (AMD EPYC) and 24 GiB" in page
    assert "Its host took 12 CPU-seconds of steal meanwhile, and 2,346 MiB of evicted files were read back" in page


def test_runs_held_to_fewer_cpus_have_a_table_of_their_own_and_are_never_the_newest_whole_run(tmp_path, monkeypatch):
    """A run under tests/slowed.py's quota (``machine.cpu_quota``) shows in its own table, from
    tests/records/suite_slowed.jsonl, with the CPUs it was held to; in suite.jsonl it would not be
    taken for a run on its machine's full cores."""
    import json

    monkeypatch.syspath_prepend(str(DOCS / "_hooks"))
    import reference

    records = tmp_path / "tests" / "records"
    records.mkdir(parents=True)
    assert "No run of the whole suite held to fewer CPUs" in reference.slowed_runs_markdown(str(tmp_path))

    def run(commit, quota, outcomes):
        machine = {"cpus": 2, "memory_gib": 24, "python": "3.11.7", **({"cpu_quota": quota} if quota else {})}
        return {"when": "2026-12-06T23:30:00Z", "commit": commit, "wall_s": 1002.0, "exit_status": 0, "args": [],
                "outcomes": outcomes, "machine": machine, "machine_cpu_s": 1273.5,
                "versions": {"tensorflow": "2.21.0", "keras": "3.15.1", "ray": "2.60.0"}, "tests_s": {"tests/x.py::t": 1.0}}

    (records / "suite_slowed.jsonl").write_text(json.dumps(run("abc1234", 1.33, {"passed": 1165, "rerun": 1})) + "\n")
    table = reference.slowed_runs_markdown(str(tmp_path))
    assert "| 2026-12-06 23:30 | `abc1234` | 2, 1.33 | 1,165 passed, 1 rerun | 16.7 | 21.2 |" in table
    (records / "suite.jsonl").write_text(json.dumps(run("full000", None, {"passed": 3})) + "\n"
                                         + json.dumps(run("held000", 1.33, {"passed": 3})) + "\n")
    assert [r["commit"] for r in reference.whole_runs(str(tmp_path))] == ["full000"]


TRACED = ("bench/results/", "<!-- raytf:bench:", "<!-- raytf:kept:")


def test_every_benchmark_table_names_its_record_or_is_rendered_from_one():
    """A table of figures on a benchmark page sits in a section that names the record of its run
    (a file in bench/results/) or is rendered from one (a raytf:bench marker): none is typed from a
    run whose JSON was not kept."""
    untraced = []
    for page in sorted((DOCS / "benchmarks").glob("*.md")):
        for section in re.split(r"^#+ ", page.read_text(), flags=re.M):
            # Each table with the text since the table before it (or the heading): where its record is named.
            for before, table in re.findall(r"((?:(?!^\|).*\n)*)((?:^\|.*\n?)+)", section, flags=re.M):
                figures = [line for line in table.splitlines() if re.search(r"\d", line) and not set(line) <= set("|-: ")]
                if figures and not any(mark in before + table for mark in TRACED):
                    untraced.append(f"{page.name}: {section.splitlines()[0]!r}: {figures[0][:60]!r}")
    assert not untraced, untraced


def test_a_benchmark_table_is_the_newest_invocation_of_its_record_with_where_it_ran(tmp_path, monkeypatch):
    """``<!-- raytf:bench:<record>:<step> -->`` renders the step's systems from the record's newest
    invocation only: medians, ranges, ratios to raytf, and the command, commit and machine."""
    import json

    monkeypatch.syspath_prepend(str(DOCS / "_hooks"))
    import records

    environment = {"commit": "abc1234", "date": "2026-11-28T05:00:00+00:00",
                   "machine": {"system": "Linux", "cpu": "Some CPU", "cores": 2, "memory_gib": 24, "python": "3.11.7"},
                   "versions": {"tensorflow": "2.21.0", "ray": "2.60.0"}}

    def line(invocation, system, speed):
        return {"invocation": invocation, "suite": "cpu-quick", "step": "w1_spe1", "command": "python bench/throughput.py",
                "environment": environment, "result": {"system": system, "samples_per_s": speed, "loss": 0.29}}

    lines = [line("old", "raytf", 1.0), line("old", "ray_train", 1.0)]
    lines += [line("new", "raytf", s) for s in (30_000, 36_000, 33_000)]
    lines += [line("new", "ray_train", s) for s in (20_000, 22_000, 24_000)]
    lines.append({**line("new", "raytf", 0), "step": "w1_spe8", "result": {"system": "raytf", "samples_per_s": 9}})
    (tmp_path / "bench" / "results").mkdir(parents=True)
    (tmp_path / "bench" / "results" / "cpu_quick.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    table = records.bench_table(str(tmp_path), "cpu_quick", "w1_spe1")
    assert "| 33,000 (30,000-36,000) | 3 | 0.290 | 1.00 |" in table
    assert "| 22,000 (20,000-24,000) | 3 | 0.290 | 1.50× |" in table
    assert "invocation `new`" in table and "commit `abc1234`" in table and "2 cores (Some CPU)" in table
    with pytest.raises(ValueError, match="no runs of step 'w2'"):
        records.bench_table(str(tmp_path), "cpu_quick", "w2")
    # A step run alone later (python -m bench <suite> --steps) is read from its own newest invocation;
    # a step whose lines are rows (the control plane's) shows its columns as printed.
    rows = [{"invocation": "later", "suite": "cpu-full", "step": "control_plane", "command": "python bench/control_plane.py",
             "environment": environment, "result": {"workers": n, "driver_ms_per_round": ms, "driver_core_share": share,
                                                    "calls_per_s": 10.0, "startup_rounds": [49, 49],
                                                    "decision_rounds": 1, "decision_ms": 4.6}}
            for n, ms, share in ((64, 0.2, 0.002), (1024, 3.4, 0.0338))]
    with open(tmp_path / "bench" / "results" / "cpu_quick.jsonl", "a") as record:
        record.write("".join(json.dumps(x) + "\n" for x in rows + [{**rows[0], "result": {"summary": {}}}]))
    table = records.bench_table(str(tmp_path), "cpu_quick", "control_plane")
    assert "| 1,024 | 3.4 | 3.38% | 10 | 49, 49 | 1 | 4.6 |" in table and "invocation `later`" in table
    assert "33,000" in records.bench_table(str(tmp_path), "cpu_quick", "w1_spe1")  # still the older invocation's


def test_w2s_table_starts_from_plain_mwms_and_the_start_up_table_shows_each_systems_phases(tmp_path, monkeypatch):
    """W2's rows are configurations, each against the anchor (plain MWMS) and labelled with the bytes
    it all-reduces per sample; start-up's figure is seconds, with each system's phases, medians."""
    import json

    monkeypatch.syspath_prepend(str(DOCS / "_hooks"))
    import records

    environment = {"commit": "abc1234", "date": "2026-11-28T05:00:00+00:00",
                   "machine": {"system": "Linux", "cpu": "Some CPU", "cores": 2, "memory_gib": 24, "python": "3.11.7"},
                   "versions": {"tensorflow": "2.21.0"}}

    def line(step, result):
        return {"invocation": "one", "suite": "cpu-full", "step": step, "command": f"python bench/{step}.py",
                "environment": environment, "result": result}

    lines = [line("w2", {"config": c, "samples_per_s": v, "loss": 0.5, "allreduce_bytes_per_sample": b})
             for c, b, speeds in (("raytf_bfloat16_ef", 625_000, (190, 200, 210)), ("plain_mwms", 1_250_000, (90, 100, 110)))
             for v in speeds]
    lines.append(line("w2", {"parameters": 20_037_642, "median": {}}))  # the summary: no row
    lines += [line("startup", {"system": s, "repeat": r, "to_first_step_s": t, "phases": phases})
              for s, phases in (("plain_mwms", {"import": 2.0, "connect": 0.1}),
                                ("raytf", {"attempt": 0, "actors": 0.8, "first_report": 0.2}))
              for r, t in enumerate((3.0, 3.4, 3.2) if s == "raytf" else (2.0, 2.2, 2.4))]
    (tmp_path / "bench" / "results").mkdir(parents=True)
    (tmp_path / "bench" / "results" / "cpu_full.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    table = records.bench_table(str(tmp_path), "cpu_full", "w2").splitlines()
    assert "this row's samples/s ÷ the first row's" in table[0]
    assert table[2] == "| plain MultiWorkerMirroredStrategy, float32; 1.25 MB all-reduced per sample | 100 (90-110) | 3 | 0.500 | 1.00 |"
    assert table[3].endswith("; 0.62 MB all-reduced per sample | 200 (190-210) | 3 | 0.500 | 2.00× |")
    table = records.bench_table(str(tmp_path), "cpu_full", "startup")
    assert "| seconds to the first step, median (range) |" in table and "phases, median s |" in table
    assert "| 3.2 (3-3.4) | 3 | 1.00 | actors 0.80, first report 0.20 |" in table
    assert "| 2.2 (2-2.4) | 3 | 1.45× | import 2.00, connect 0.10 |" in table


def test_a_kept_output_file_renders_as_its_benches_runs(tmp_path, monkeypatch):
    """``<!-- raytf:kept:<file>:<step> -->``: a bench's output kept as it printed it (no environment
    around each line) renders as that step's runs, naming the file; a summary line is no row, and a
    line Ray printed into the file is skipped."""
    import json

    monkeypatch.syspath_prepend(str(DOCS / "_hooks"))
    import records

    runs = [{"system": "raytf_async", "storage": "local", "worker_env": {}, "blocked_s": [0.11, 0.9],
             "blocked_mean_s": 0.505, "steps_per_s": 5.58, "steps_per_s_without": 9.27},
            {"system": "ray_train_async", "storage": "local", "worker_env": {"TF_ENABLE_ONEDNN_OPTS": "0"},
             "blocked_s": [1.88, 1.62], "blocked_mean_s": 1.75, "steps_per_s": 4.58, "steps_per_s_without": 9.34},
            {"summary": "w3", "raytf_async_local_blocked_mean_s": 0.505}]
    (tmp_path / "bench" / "results").mkdir(parents=True)
    lines = [json.dumps(r) + "\n" for r in runs]
    lines.insert(1, "(raylet) A worker died or was killed while executing a task\n")  # Ray's, between the bench's
    (tmp_path / "bench" / "results" / "w3_kept.jsonl").write_text("".join(lines))
    table = records.kept_table(str(tmp_path), "w3_kept", "w3_env").splitlines()
    assert table[2] == '| raytf, `upload="async"` (the default) | raytf\'s defaults | 0.11, 0.9 | 0.505 | 5.58 | 9.27 |'
    assert table[3].startswith("| Ray Train, `checkpoint_upload_mode` ASYNC | `TF_ENABLE_ONEDNN_OPTS=0` | 1.88, 1.62 |")
    assert len([line for line in table if line.startswith("| ")]) == 4  # the header, its rule, two runs
    assert "`bench/results/w3_kept.jsonl`, one line per run as the bench printed it" in table[-1]
    with pytest.raises(ValueError, match="no kept benchmark output"):
        records.kept_table(str(tmp_path), "missing", "w3")


def test_a_figure_in_prose_is_read_off_its_record_when_the_site_is_built(tmp_path, monkeypatch):
    """``<!-- raytf:figure:<file>:<where>:<key>[:<format>[:<mode>]] -->`` renders one figure of a
    record's newest invocation (or of a kept file): the lines ``where`` picks, their median, range
    or both; a list's runs (``.*``); a ratio of two fields (``a|b``); two systems' ratio round by
    round (``field@by=a/b``); a missing one fails the build."""
    import json

    monkeypatch.syspath_prepend(str(DOCS / "_hooks"))
    import generate
    import records

    def line(invocation, result):
        return {"invocation": invocation, "suite": "cpu-full", "step": "w3_local", "command": "python bench/w3.py",
                "environment": {}, "result": result}

    results = tmp_path / "bench" / "results"
    results.mkdir(parents=True)
    record = [line("old", {"system": "raytf_async", "blocked_s": [9.0]})]
    record += [line("new", {"system": "raytf_async", "blocked_s": [b, 0.9], "steps_per_s": 6.0, "steps_per_s_without": 8.0})
               for b in (0.07, 0.11, 0.06)]
    record.append(line("new", {"system": "ray_train_async", "blocked_s": [1.8, 1.9]}))
    # Two systems run round by round, as bench/throughput.py runs them: per round 1.2, 1.5 and 1.25.
    record += [line("new", {"system": system, "repeat": r, "samples_per_s": speed})
               for r, pair in enumerate(((120, 100), (300, 200), (250, 200))) for system, speed in zip(("a", "b"), pair)]
    (results / "cpu_full.jsonl").write_text("".join(json.dumps(x) + "\n" for x in record))
    (results / "kept.jsonl").write_text(json.dumps({"measure": "copy, fresh buffer (pause)", "seconds": [0.8, 0.7]}) + "\n")

    def render(marker):
        return generate.FIGURE.sub(lambda f: records.figure(str(tmp_path), *(g or "" for g in f.groups())), marker)

    pick = "cpu_full:step=w3_local,system=raytf_async"
    assert render(f"<!-- raytf:figure:{pick}:blocked_s.0:.2f -->") == "0.07"
    assert render(f"<!-- raytf:figure:{pick}:blocked_s.0:.2f:range -->") == "0.06-0.11"
    assert render(f"<!-- raytf:figure:{pick}:blocked_s.0:.2f:both -->") == "0.07 (0.06-0.11)"
    assert render(f"<!-- raytf:figure:{pick}:steps_per_s|steps_per_s_without:.2f -->") == "0.75"
    assert render("<!-- raytf:figure:kept:measure~=fresh buffer:seconds.*:.1f:range --> s") == "0.7-0.8 s"
    # The median of the rounds' ratios, and their range.
    assert render("<!-- raytf:figure:cpu_full:step=w3_local:samples_per_s@system=a/b:.2f:both -->x") == "1.25 (1.20-1.50)x"
    assert render("<!-- raytf:figure:cpu_full:step=w3_local:samples_per_s@system=b/a:.2f:range -->") == "0.67-0.83"
    with pytest.raises(ValueError, match="no line"):
        render(f"<!-- raytf:figure:{pick}:restore_s -->")


def test_a_new_run_is_checked_against_the_ranges_the_page_stated_from_the_run_before(tmp_path, monkeypatch):
    """``python -m bench reproduces <suite>`` (records.reproduced): each figure that states a range
    from the record, read off the invocation before the newest (what the page stated), holds the
    newest invocation's median, or says it does not; a figure without a range is not checked."""
    import json

    monkeypatch.syspath_prepend(str(DOCS / "_hooks"))
    import records

    def rounds(invocation, ratios):
        return [{"invocation": invocation, "suite": "cpu-quick", "step": "w1", "command": "", "environment": {},
                 "result": {"system": system, "repeat": r, "samples_per_s": speed}}
                for r, ratio in enumerate(ratios) for system, speed in (("raytf", 100 * ratio), ("ray_train", 100))]

    results = tmp_path / "bench" / "results"
    results.mkdir(parents=True)
    record = results / "cpu_quick.jsonl"
    stated = "<!-- raytf:figure:cpu_quick:step=w1:samples_per_s@system=raytf/ray_train:.2f:both -->"
    page = f"1.3 (1.2-1.5){stated} and 1.3<!-- raytf:figure:cpu_quick:step=w1:samples_per_s@system=raytf/ray_train:.2f -->"
    record.write_text("".join(json.dumps(x) + "\n" for x in rounds("before", (1.2, 1.3, 1.5)) + rounds("new", (1.0, 1.4, 1.45))))
    [checked] = records.reproduced(str(tmp_path), "cpu_quick", page)
    assert checked["stated_range"] == pytest.approx([1.2, 1.5]) and checked["median_now"] == pytest.approx(1.4)
    assert checked["within"]
    record.write_text("".join(json.dumps(x) + "\n" for x in rounds("before", (1.2, 1.3, 1.5)) + rounds("new", (1.0, 1.1, 1.6))))
    [checked] = records.reproduced(str(tmp_path), "cpu_quick", page)
    assert checked["median_now"] == pytest.approx(1.1) and not checked["within"]
    assert records.reproduced(str(tmp_path), "cpu_full", page) == []


def test_every_chart_reads_the_records_its_section_names():
    """A chart on a page (``charts/<name>.svg``, drawn by bench/charts.py) reads only records the
    section around it names, so a chart cannot show another run than its table."""
    tree = ast.parse((ROOT / "bench" / "charts.py").read_text())
    functions = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
    charts = next(node.value for node in tree.body if isinstance(node, ast.AnnAssign)
                  and getattr(node.target, "id", None) == "CHARTS")
    reads = {key.value: {c.value for c in ast.walk(functions[value.id]) if isinstance(c, ast.Constant)
                         and isinstance(c.value, str) and c.value.endswith(".jsonl")}
             for key, value in zip(charts.keys, charts.values)}
    shown = 0
    for page in pages():
        for section in re.split(r"^#+ ", page.read_text(), flags=re.M):
            for name in re.findall(r"\(\.\./charts/(\w+)\.svg\)", section):
                shown += 1
                unnamed = {f for f in reads[name] if f not in section}
                assert not unnamed, f"{page.name}: chart {name} reads {sorted(unnamed)}, which its section never names"
    assert shown >= 5


# -- the API reference: signatures, and nothing internal ------------------------------------------

API = ROOT / "tests" / "docs" / "api.txt"
HEADING = re.compile(r'<h[2-6] id="(raytf\.[\w.]*)"')


def text_of(fragment: str) -> str:
    """A signature's text, independent of how the formatter of the day wraps and quotes it."""
    import html

    text = " ".join(html.unescape(re.sub(r"<[^>]+>", "", fragment)).split()).replace("'", '"')
    return re.sub(r"\s*,?\s*\)", ")", re.sub(r"\(\s+", "(", text))


def reference_entries(site: pathlib.Path) -> dict[str, str]:
    """Each name the built reference pages show -> the signature shown under its heading ("" if none)."""
    entries = {}
    for page in sorted((site / "reference").glob("*/index.html")):
        html = page.read_text()
        headings = list(HEADING.finditer(html)) + [None]
        for heading, following in zip(headings, headings[1:]):
            section = html[heading.end():following.start() if following else len(html)]
            signature = re.search(r'<div class="doc-signature[^"]*">(.*?)</div>', section, re.S)
            entries[heading.group(1)] = text_of(signature.group(1)) if signature else ""
    return entries


def public_object(name: str):
    import importlib

    module, _, attribute = name.rpartition(".")
    return getattr(importlib.import_module(module), attribute)


def test_each_public_class_and_function_shows_its_signature_with_every_parameter(site):
    import inspect

    entries = reference_entries(site)
    checked = 0
    for name in public_names():
        obj = public_object(name)
        if not (inspect.isclass(obj) or inspect.isfunction(obj)) or not_constructed_by_users(obj):
            continue
        parameters = [p for p in inspect.signature(obj).parameters.values()
                      if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        # raytf.launch, the function, is shown in its module's entry (raytf.launch.launch).
        shown = entries.get(name) or entries.get(f"{obj.__module__}.{obj.__qualname__}", "")
        assert shown, f"{name}: no signature under its heading in the reference"
        missing = [p.name for p in parameters if not re.search(rf"\b{p.name}\b", shown)]
        assert not missing, f"{name}: the signature shown ({shown!r}) lacks {missing}"
        checked += 1
    assert checked >= 40, checked


def not_constructed_by_users(obj) -> bool:
    """raytf's errors and enums: raytf makes them; the reference shows what they hold. Abstract
    bases (the policies): users subclass them; the reference shows the methods to implement."""
    import enum
    import inspect

    return inspect.isclass(obj) and (issubclass(obj, (BaseException, enum.Enum)) or inspect.isabstract(obj))


def test_the_reference_shows_exactly_the_api_of_tests_docs_api_txt(site):
    """Every name the reference shows, with its signature, against the reviewed list in
    tests/docs/api.txt (as TensorFlow keeps golden API files): a method or attribute that becomes
    public by its name alone fails here. Add it to api.txt where users should call it; else name
    it with a leading underscore. ``RAYTF_UPDATE_API=1`` rewrites api.txt from the site."""
    shown = [f"{name} {signature}".rstrip() for name, signature in sorted(reference_entries(site).items())]
    if os.environ.get("RAYTF_UPDATE_API") == "1":
        API.write_text("".join(line + "\n" for line in shown))
    expected = API.read_text().splitlines()
    added, removed = sorted(set(shown) - set(expected)), sorted(set(expected) - set(shown))
    assert not added and not removed, f"shown but not in api.txt: {added}\nin api.txt but not shown: {removed}"


def message_texts() -> list[str]:
    """The text of every string raytf's code writes, an f-string's placeholders cut out."""
    texts = []
    for path in sorted((ROOT / "raytf").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.JoinedStr):
                texts.append("\x00".join(v.value for v in node.values if isinstance(v, ast.Constant)))
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                texts.append(node.value)
    return [" ".join(t.split()) for t in texts]


def test_each_message_the_troubleshooting_page_quotes_is_one_raytf_writes():
    page = (DOCS / "guides" / "troubleshooting.md").read_text()
    seen = [p for p in page.split("\n\n") if p.startswith("**You see**")]
    quotes = [" ".join(q.split()) for p in seen for q in re.findall(r'"([^"]+)"', p)]
    assert len(seen) >= 10 and len(quotes) >= 10, (len(seen), quotes)
    texts = message_texts()
    stale = [q for q in quotes if not any(q in t for t in texts)]
    assert not stale, f"quoted on the troubleshooting page but written nowhere in raytf/: {stale}"
