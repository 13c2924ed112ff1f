"""The memory bound (specdemo/host/memory.py) on synthetic numbers: the budget read from the environment, the anonymous
memory of a process tree, what a cgroup v1 or v2 limit leaves (files written in a temporary folder as the kernel lays
them out), and a step that waits for room, goes on when there is, and skips with a sentence when there is not."""

from pathlib import Path

import pytest

from specdemo.host import memory

GIB = 2**30


def test_the_budget_is_8_gib_unless_the_environment_says_otherwise():
    assert memory.budget({}) == 8 * GIB
    assert memory.budget({memory.BUDGET_VARIABLE: "16G"}) == 16 * GIB
    assert memory.budget({memory.BUDGET_VARIABLE: "7.5GiB"}) == int(7.5 * GIB)
    assert memory.budget({memory.BUDGET_VARIABLE: "6000M"}) == 6000 * 2**20
    assert memory.budget({memory.BUDGET_VARIABLE: "1073741824"}) == GIB


def test_a_budget_that_is_no_amount_of_memory_is_refused_with_a_sentence():
    with pytest.raises(ValueError, match="SPECDEMO_MEMORY_BUDGET='lots' is not an amount of memory; write e.g. 8G"):
        memory.budget({memory.BUDGET_VARIABLE: "lots"})


def fake_proc(tmp_path: Path, processes: dict[int, tuple[int, int]]) -> Path:
    """A /proc with `processes` {pid: (parent pid, RssAnon in kB)}; the command holds a space and a parenthesis."""
    proc = tmp_path / "proc"
    for pid, (parent, anon_kb) in processes.items():
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "stat").write_text(f"{pid} (python -m (x) y) S {parent} {pid} 0 0\n")
        (proc / str(pid) / "status").write_text(f"Name:\tpython\nRssAnon:\t{anon_kb} kB\nRssFile:\t999999 kB\n")
    return proc


def test_the_tree_counts_the_root_and_every_descendant_and_nothing_else(tmp_path):
    proc = fake_proc(tmp_path, {10: (1, 1000), 11: (10, 200), 12: (11, 30), 20: (1, 5000)})
    assert sorted(memory.tree(10, proc)) == [10, 11, 12]
    assert memory.tree_anonymous(10, proc) == (1000 + 200 + 30) * 1024  # the mapped files (RssFile) are not counted
    assert memory.anonymous(99, proc) == 0  # a process gone


def test_pages_a_forked_child_still_shares_with_its_parent_count_once(tmp_path):
    """A 2 GiB process that has just forked: each shows 2 GiB of RssAnon, and half of it as its proportional share."""
    proc = fake_proc(tmp_path, {10: (1, 2 * 2**20), 11: (10, 2 * 2**20)})
    for pid in (10, 11):
        (proc / str(pid) / "smaps_rollup").write_text(f"Rss:\t{2 * 2**20} kB\nPss_Anon:\t{2**20} kB\nAnonymous:\t{2 * 2**20} kB\n")
    assert memory.tree_anonymous(10, proc) == 2 * 2**30


def cgroup_v1(tmp_path: Path, limit: int, usage: int, inactive_file: int, parent_limit: int | None = None) -> Path:
    """cgroup v1's memory controller as on this project's machines: /sys/fs/cgroup/memory/process_api/<id>."""
    group = tmp_path / "memory" / "process_api" / "abc"
    group.mkdir(parents=True)
    (group / "memory.limit_in_bytes").write_text(f"{limit}\n")
    (group / "memory.usage_in_bytes").write_text(f"{usage}\n")
    (group / "memory.stat").write_text(f"cache 1\ninactive_file 7\ntotal_inactive_file {inactive_file}\n")
    if parent_limit is not None:
        (group.parent / "memory.limit_in_bytes").write_text(f"{parent_limit}\n")
        (group.parent / "memory.usage_in_bytes").write_text(f"{usage}\n")
    return tmp_path


V1 = "9:name=systemd:/\n4:memory:/process_api/abc\n1:cpu:/\n0::/\n"


def test_a_cgroup_v1_limit_leaves_the_limit_less_the_usage_that_is_not_reclaimable_file_pages(tmp_path):
    mount = cgroup_v1(tmp_path, limit=16 * GIB, usage=10 * GIB, inactive_file=3 * GIB)
    assert memory.cgroup_left(V1, mount) == 16 * GIB - 7 * GIB


def test_no_cgroup_v1_limit_is_no_limit(tmp_path):
    mount = cgroup_v1(tmp_path, limit=9223372036854771712, usage=GIB, inactive_file=0)
    assert memory.cgroup_left(V1, mount) is None


def test_the_tightest_of_a_cgroup_and_its_parents_limits_counts(tmp_path):
    mount = cgroup_v1(tmp_path, limit=9223372036854771712, usage=5 * GIB, inactive_file=0, parent_limit=6 * GIB)
    assert memory.cgroup_left(V1, mount) == GIB


def test_a_space_sees_cgroup_v2_at_the_root_of_its_own_namespace(tmp_path):
    """A Hugging Face Space: a container whose /proc/self/cgroup reads "0::/", memory.max at /sys/fs/cgroup."""
    (tmp_path / "memory.max").write_text(f"{16 * 10**9}\n")
    (tmp_path / "memory.current").write_text(f"{5 * GIB}\n")
    (tmp_path / "memory.stat").write_text(f"anon {4 * GIB}\nfile {GIB}\nactive_file 0\ninactive_file {GIB // 2}\n")
    assert memory.cgroup_left("0::/\n", tmp_path) == 16 * 10**9 - (5 * GIB - GIB // 2)
    (tmp_path / "memory.max").write_text("max\n")
    assert memory.cgroup_left("0::/\n", tmp_path) is None


def test_room_is_the_least_of_the_bound_the_cgroup_and_the_machine():
    assert memory.Room(8 * GIB, 3 * GIB, None, 20 * GIB).left == 5 * GIB  # the bound
    assert memory.Room(8 * GIB, 3 * GIB, 2 * GIB, 20 * GIB).left == 2 * GIB  # the cgroup
    assert memory.Room(8 * GIB, 3 * GIB, 9 * GIB, GIB).left == GIB  # the machine
    assert "5.0 GiB left: the app holds 3.0 GiB of its 8.0 GiB bound" in memory.Room(8 * GIB, 3 * GIB, None, 20 * GIB).describe()


def test_a_step_waits_for_room_and_says_so_then_goes_on():
    rooms = iter([memory.Room(8 * GIB, 7 * GIB, None, 20 * GIB)] * 2 + [memory.Room(8 * GIB, 2 * GIB, None, 20 * GIB)])
    said = []
    assert memory.wait_for(3 * GIB, "compiling the target", said.append, wait_s=60, poll_s=0.01,
                           measure=lambda: next(rooms))
    assert len(said) == 2 and "compiling the target waits: it needs about 3.0 GiB" in said[0]
    assert "compiling the target goes on" in said[1]


def test_a_step_without_room_skips_with_a_line_that_says_why():
    said = []
    assert not memory.wait_for(3 * GIB, "converting the draft", said.append, wait_s=0.05, poll_s=0.01,
                               measure=lambda: memory.Room(8 * GIB, 7 * GIB, None, 20 * GIB))
    assert "skipping converting the draft: it needs about 3.0 GiB and there is 1.0 GiB left" in said[-1]


def test_a_step_with_room_says_nothing():
    said = []
    assert memory.wait_for(GIB, "compiling", said.append, measure=lambda: memory.Room(8 * GIB, GIB, None, 20 * GIB))
    assert said == []


def test_a_step_started_by_the_page_counts_the_page_beside_itself(monkeypatch):
    import os

    assert memory.app_root({memory.ROOT_VARIABLE: str(os.getppid())}) == os.getppid()
    assert memory.app_root({}) == os.getpid()
    assert memory.app_root({memory.ROOT_VARIABLE: "999999999"}) == os.getpid()  # gone: this process's tree


def test_the_bench_asks_more_room_for_a_section_that_loads_more_beside_its_pair():
    from specdemo.bench.memory import section_need

    target, draft = 1_780_000_000, 400_000_000  # the default pair's IR weights: INT8 1.5B, INT4 0.5B
    f32_peer, genai, lookup, vocab = (section_need(name, target, draft) for name in ("transformers", "paper", "lookup", "vocab"))
    assert f32_peer > 8 * GIB > genai > lookup > 2 * memory.compile_need(target) > vocab  # the f32 peer cannot fit a Space
    with_genai = section_need("k", target, draft, (2, 4))
    assert with_genai > section_need("k", target, draft)  # GenAI's plain and speculative pipelines beside the pair
    assert section_need("k", target, draft, (2, 4, 6, 8)) == with_genai == genai  # one speculative pipeline, K per call


def test_the_bench_skips_at_once_a_section_that_the_bound_cannot_give_beside_its_pair(monkeypatch):
    from specdemo.bench.memory import room_for

    monkeypatch.setenv(memory.BUDGET_VARIABLE, "8G")
    no_wait = lambda *args, **kwargs: pytest.fail("no wait can make room under the bound")  # noqa: E731
    monkeypatch.setattr(memory, "wait_for", no_wait)
    said = []
    assert not room_for(6 * GIB, "the transformers section", said.append, holding=lambda: 3 * GIB)
    assert said == ["memory: skipping the transformers section: it needs about 6.0 GiB and the 8.0 GiB bound leaves "
                    "5.0 GiB beside what the bench holds (SPECDEMO_MEMORY_BUDGET sets the bound)"]
    monkeypatch.setattr(memory, "wait_for", lambda need, what, log: True)  # within the bound: the machine decides
    assert room_for(4 * GIB, "the paper section", said.append, holding=lambda: 3 * GIB) and len(said) == 1


def test_the_papers_second_pass_loads_genais_defaults_only_after_the_first_passs_pipelines_are_gone(monkeypatch):
    """GenAI's pipelines each hold a copy of the target: four alive at once took the section to 9.2 GiB."""
    import weakref

    from specdemo.bench import harness, peers, sections, table
    from specdemo.settings import RunSettings

    alive = weakref.WeakSet()

    class Pipeline:  # GenAI's pipeline, as far as the section's memory goes
        def __init__(self, *args, **kwargs):
            alive.add(self)

        def generate(self, *args, **kwargs):
            raise AssertionError("not run here")

    most = []

    def measure(lanes, instructions, prompts, n, bench, log):  # the runs refer to their lanes, as the real ones do
        import gc

        gc.collect()
        most.append(len(alive))
        return [table.Run(lane, 0, 0, n, 1.0, n) for lane in lanes]

    monkeypatch.setattr(peers, "PeerProcess", Pipeline)
    monkeypatch.setattr(sections, "measure", measure)
    monkeypatch.setattr(sections, "genai_compile", lambda target, draft: {})
    monkeypatch.setattr(sections, "our_lane", lambda label, engine, mode, generation, baseline=None: table.Lane(
        label, "specdemo", mode, baseline))
    monkeypatch.setattr(harness, "genai_properties", lambda target, draft, defaults=False: ({}, {}))

    class Engine:
        target = draft = type("Model", (), {"folder": "ir", "settings": RunSettings().target})()
        eos_ids = [0]

        def prompt_ids(self, text, generation):
            return [1, 2]

    from specdemo.bench.settings import BenchSettings

    bench = BenchSettings(mode="test", instructions=1, paper_tokens=(8,), genai_defaults_instructions=1)
    ctx = harness.Context(Engine(), RunSettings(), bench, log=lambda message: None)
    sections.run_paper(ctx)
    assert most == [2, 2]  # the first pass's plain and speculative pipelines, then only GenAI's defaults' two
