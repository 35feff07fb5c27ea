"""The workshop tools: the learners' edition hides every solution, the schedule is current."""

from __future__ import annotations

import ast
import contextlib
import copy
import dataclasses
import re
from pathlib import Path

import nbformat
import pytest

from ddp_lib import scripts
from workshop import exercises, schedule, sections

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


@pytest.fixture(scope="module")
def edition(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("exercises") / "notebooks"


@pytest.fixture(scope="module")
def built(edition) -> dict[str, tuple[dict, dict]]:
    """Each lesson's name: (the course's notebook, its learners' edition)."""
    exercises.build(edition.parent)
    return {path.name: (nbformat.read(path, as_version=4),
                        nbformat.read(edition / path.name, as_version=4))
            for path in NOTEBOOKS}


def cell_text(cell: dict) -> str:
    return exercises.source(cell)


def test_every_lesson_has_an_edition(built):
    assert sorted(built) == [p.name for p in NOTEBOOKS]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_solution_line_reaches_the_edition(built, path):
    course, learners = built[path.name]
    lesson_text = "\n".join(cell_text(c) for c in course["cells"] if not exercises.is_solution(c))
    edition_text = "\n".join(cell_text(c) for c in learners["cells"])
    for cell in course["cells"]:
        if not exercises.is_solution(cell):
            continue
        lines = cell_text(cell).splitlines()
        if sections.START in cell["metadata"]:  # its stub writes the start: the lines it adds
            first, _, body = cell_text(cell).partition("\n")
            start = sections.start_text(cell).splitlines()
            lines = [line for line in scripts.script_of(first, body).splitlines()
                     if line not in start]
        for line in lines:
            line = line.strip()
            if line and line not in lesson_text:  # lines the lesson shows anyway are no leak
                assert line not in edition_text, f"{path.name}: solution line leaked: {line}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_stubs_are_python_and_replace_each_solution(built, path):
    course, learners = built[path.name]
    assert len(course["cells"]) == len(learners["cells"])
    for ours, theirs in zip(course["cells"], learners["cells"], strict=True):
        if exercises.is_solution(ours) and sections.START in ours["metadata"]:
            # the script the learner edits, written under the solution's name, with its steps
            # as TODO comments where the solution says, and nothing else added
            name, _ = scripts.header(cell_text(ours).partition("\n")[0])
            first = f"%%write_script {name}"  # the whole script, not a change to one
            start = sections.start_text(ours).rstrip()
            steps = ours["metadata"].get(exercises.TODOS, [])
            assert cell_text(theirs) == f"{first}\n{exercises.faded(start, steps)}"
            added = [line.strip() for line in cell_text(theirs).splitlines()[1:]
                     if line not in start.splitlines()]
            assert all(line.startswith("# TODO") or line.startswith("#   ") for line in added)
            assert sum(line.startswith("# TODO") for line in added) == len(steps)
            assert exercises.STUB in theirs["metadata"]["tags"]
        elif exercises.is_solution(ours):
            assert exercises.STUB in theirs["metadata"]["tags"]
            assert not exercises.is_solution(theirs)
            ast.parse(cell_text(theirs))
            answers = ours["metadata"].get(exercises.ANSWERS, [])  # what its check reads
            last = [f"{name} = ..." for name in answers] or ["pass"]
            assert cell_text(theirs).rstrip().splitlines()[-len(last):] == last, (
                "the stub does nothing but leave its check's answers to write")
        elif exercises.CHECK in ours["metadata"].get("tags", []):  # kept, and Run All goes on
            assert theirs["metadata"]["tags"] == [*ours["metadata"]["tags"], "raises-exception"]
            assert cell_text(theirs) == cell_text(ours)
        else:  # copied unchanged, the instructor's notes folded
            theirs = copy.deepcopy(theirs)
            if ours.metadata.get(sections.KEY, {}).get("tier") == "instructor":
                assert theirs.metadata.pop("jupyter") == {"source_hidden": True}
            assert theirs == ours, "every other cell is copied unchanged"
    assert learners["metadata"] == course["metadata"]


def test_the_conversions_stub_marks_the_seven_steps_in_lesson_01s_script():
    notebook = nbformat.read(ROOT / "notebooks" / "05_ddp.ipynb", as_version=4)
    [index] = [i for i, c in enumerate(notebook.cells) if exercises.is_solution(c)
               and c.source.startswith("%%write_script my_train_ddp.py")]
    stub = cell_text(exercises.stub(notebook.cells[index], notebook.cells[index - 1]))
    todos = [line.strip() for line in stub.splitlines() if line.strip().startswith("# TODO")]
    assert [t.split(":")[0] for t in todos] == [f"# TODO {n}" for n in range(1, 8)]
    lines = stub.splitlines()
    # each step sits where it goes: the group before the seed, the sampler before the loader...
    for todo, then in [(1, "torch.manual_seed(0)"), (2, "prepare_cifar10()"),
                       (3, "train_loader = DataLoader("), (6, "save_checkpoint(")]:
        at = next(i for i, line in enumerate(lines) if f"# TODO {todo}:" in line)
        after = next(line for line in lines[at + 1:] if not line.strip().startswith("#"))
        assert after.strip().startswith(then), (todo, after)
    with pytest.raises(ValueError, match="TODO 1: no line 'nowhere' in the script"):
        exercises.faded("a = 1", [["nowhere", "before", "x"]])


def test_a_stub_keeps_the_questions_code_block_line_for_line():
    exercise = {"cell_type": "markdown", "source": (
        "**2.** Rank 3 sees the environment below. Which numbers does it get?\n\n```python\n"
        '{"PMI_RANK": "3", "PMI_SIZE": "4",\n "SLURM_PROCID": "1"}\n```\n\nWrite them in '
        "`numbers`.\n\n<details>x</details>")}
    solution = {"cell_type": "code", "metadata": {"tags": ["solution"],
                                                  exercises.ANSWERS: ["numbers"]},
                "outputs": [], "execution_count": 1,
                "source": "# Solution to exercise 2\nnumbers = [3, 4]"}
    assert exercises.source(exercises.stub(solution, exercise)).splitlines()[1:] == [
        "#", "# Rank 3 sees the environment below. Which numbers does it get?",
        '#     {"PMI_RANK": "3", "PMI_SIZE": "4",', '#      "SLURM_PROCID": "1"}',
        "# Write them in `numbers`.", "numbers = ..."]


def test_a_solution_becomes_a_stub_that_names_its_exercise():
    exercise = {"cell_type": "markdown",
                "source": "**3.** Add two numbers.\n\n<details>x</details>"}
    solution = {"cell_type": "code", "metadata": {"tags": ["solution"]}, "outputs": [],
                "execution_count": 1, "source": "# Solution to exercise 3\nprint(1 + 2)"}
    stub = exercises.stub(solution, exercise)
    assert exercises.source(stub).splitlines() == [
        "# Exercise 3: write your code here, then run the cell.", "#", "# Add two numbers.",
        "pass"]
    assert stub["metadata"]["tags"] == [exercises.STUB]


def test_a_stub_says_which_cells_to_edit_when_the_solution_names_them():
    exercise = {"cell_type": "markdown", "source": "**1.** Remove a line of the script."}
    solution = {"cell_type": "code", "outputs": [], "execution_count": None,
                "metadata": {"tags": ["solution"], "jupyter": {"source_hidden": True},
                             exercises.STUB_INSTRUCTION: "edit section 2's script cell, run it, "
                                                         "then the launch cell of section 4."},
                "source": "# Solution to exercise 1\nprint(1)"}
    stub = exercises.stub(solution, exercise)
    assert exercises.source(stub).splitlines() == [
        "# Exercise 1: edit section 2's script cell, run it, then the launch cell of section 4.",
        "#", "# Remove a line of the script.", "pass"]
    assert stub["metadata"] == {"tags": [exercises.STUB]}, "shown, and nothing left to hide"


def test_minutes_line_matches_the_metadata():
    found = schedule.lessons()
    assert [lesson.number for lesson in found] == [p.name[:2] for p in NOTEBOOKS]
    assert all(lesson.teaching_min > 0 for lesson in found)
    assert all(any(s.exercises for s in lesson.sections) for lesson in found)


def test_a_wrong_minutes_line_is_refused(tmp_path):
    notebook = nbformat.read(NOTEBOOKS[0], as_version=4)
    notebook.metadata[schedule.KEY]["teaching_min"] += 5
    nbformat.write(notebook, tmp_path / NOTEBOOKS[0].name)
    with pytest.raises(ValueError, match="must say the same"):
        schedule.lessons(tmp_path)


def test_every_lesson_has_notes_and_run_times():
    numbers = {lesson.number for lesson in schedule.lessons()}
    assert numbers == set(schedule.NOTES) == set(schedule.CPU_SECONDS) == set(schedule.GPU_SECONDS)
    assert all(seconds > 0 for seconds, _ in schedule.CPU_SECONDS.values())


def test_the_committed_schedule_is_current():
    assert schedule.main(["--check"]) == 0, "docs/schedule.md is stale: run make schedule"


def test_every_section_and_exercise_has_its_tier_and_enough_minutes():
    assert sections.problems(sections.all_sections()) == []


def long_lesson(folder: Path, minutes: int, code: list[str], exercises_heading: bool) -> Path:
    """A lesson of one section, "1. Long" (402 words, then ``code`` cells, stating
    ``minutes``), and one exercise whose solution is 12 lines."""
    heading = [nbformat.v4.new_markdown_cell("## Exercises", metadata={
        "ddp_workshop": {"tier": "core", "audiences": ["ML"], "minutes": 1}})]
    notebook = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# 99 · A lesson"),
        nbformat.v4.new_markdown_cell("## 1. Long\n\n" + "word " * 400, metadata={
            "ddp_workshop": {"tier": "core", "audiences": ["ML"], "minutes": minutes}}),
        *map(nbformat.v4.new_code_cell, code), *(heading if exercises_heading else []),
        nbformat.v4.new_markdown_cell("**1.** Write it.", metadata={
            "ddp_workshop": {"tier": "core", "minutes": 1}}),
        nbformat.v4.new_code_cell("# Solution to exercise 1\n" + "y = 2\n" * 12),
    ])
    nbformat.write(notebook, folder / "99_lesson.ipynb")
    return folder / "99_lesson.ipynb"


def test_a_section_stating_less_than_its_words_code_and_runs_need_is_named(tmp_path):
    lesson = long_lesson(tmp_path, 2, ["x = 1\n" * 60], exercises_heading=True)
    found = {"99": sections.read(lesson, {"99": {0: 90.0}})}
    said = sections.problems(found)
    # 402 words at 130 a minute, 60 lines at 30 a minute, 90 s of runs: 3.1 + 2 + 1.5 -> 7
    assert said == [
        "99 cell 1 '1. Long': 2 min stated, at least 7 needed (402 words, 60 lines of code, "
        "90 s of runs)",
        "99 exercise 1: 1 min stated, at least 3 needed (3 words, 12 lines to write, 0 s of runs)"]


def test_the_learners_time_is_reading_typing_running_and_a_multiple_for_exercises(tmp_path):
    lesson = long_lesson(tmp_path, 5, ["x = 1\n" * 30, "x = 2\n" * 30], exercises_heading=False)
    [section] = sections.read(lesson, {"99": {0: 60.0, 1: 30.0}})
    # 402 words at 100 a minute, 60 lines at 12, 2 cells at 30 s, 90 s of runs x 1.5:
    # 4.02 + 5 + 1 + 2.25 = 12.27 -> 13 minutes, above the 5 stated
    assert section.learners_time() == pytest.approx(12.27)
    assert section.room_minutes == 13
    # 3 words, 12 lines, 1 cell, no run: (0.03 + 1 + 0.5) x 1.75 = 2.68 -> 3, above the 1 stated
    [exercise] = section.exercises
    assert exercise.learners_time() == pytest.approx(2.6775)
    assert exercise.room_minutes == 3
    # Where the stated minutes are longer, they stand.
    exercise.meta["minutes"] = 30
    assert exercise.room_minutes == 30


@pytest.mark.parametrize("track", schedule.TRACKS, ids=lambda t: t.name)
def test_each_track_fits_its_days_with_the_ddp_conversion_before_lunch(track):
    found = schedule.lessons()
    days = schedule.pack(track, found)
    assert len(days) == track.days
    chosen = schedule.slots(track, found)
    assert [slot for day in days for _, slot in day] == chosen, "every slot, in order"
    for day in days:
        for start, slot in day:
            assert any(begin <= start and start + slot.minutes <= end
                       for begin, end in schedule.BLOCKS), (track.name, slot.section.title)
            assert slot.minutes == slot.section.room_minutes + sum(
                e.room_minutes for e in slot.exercises), "the learners' minutes, not the floor"
    lesson, number = schedule.DDP_IN_HAND
    [(start, conversion)] = [(start, slot) for start, slot in days[0]
                             if slot.lesson.number == lesson
                             and any(e.number == number for e in slot.exercises)]
    assert start + conversion.minutes <= schedule.LUNCH[0]
    assert conversion.minutes >= 30, "the conversion keeps its 30 minutes"


@pytest.mark.parametrize("track", schedule.TRACKS, ids=lambda t: t.name)
def test_a_track_teaches_its_audiences_core_and_no_lesson_as_key_points_alone(track):
    found = {lesson.number: lesson for lesson in schedule.lessons()}
    taught = {(s.lesson.number, s.section.cell) for s in schedule.slots(track, found.values())}
    for number in track.order:
        for section in found[number].sections:
            if section.tier == "core" and (track.audience is None
                                           or track.audience in section.audiences):
                assert (number, section.cell) in taught, (track.name, str(section))
        shown = [s for s in found[number].sections if (number, s.cell) in taught
                 and schedule.section_key(number, s) and not s.title.endswith("Set-up")]
        assert shown, f"{track.name}: lesson {number} is its set-up and key points alone"
    assert {lesson for lesson, _ in taught} == set(track.order)


def test_the_one_day_tracks_are_for_their_audiences():
    tracks = {track.name: track for track in schedule.TRACKS}
    found = schedule.lessons()
    ml = {s.lesson.number for s in schedule.slots(tracks["ml"], found)}
    hpc = {s.lesson.number for s in schedule.slots(tracks["hpc"], found)}
    assert {"05", "07", "08", "11"} <= ml and not {"06", "10"} & ml
    assert {"05", "06", "09", "10"} <= hpc and not {"07", "08", "11"} & hpc
    assert set(tracks["two-day"].order) == {lesson.number for lesson in found}


def test_the_hpc_track_teaches_the_launchers_right_after_the_multi_node_launch():
    track = next(t for t in schedule.TRACKS if t.name == "hpc")
    order = [slot.lesson.number for day in schedule.pack(track, schedule.lessons())
             for _, slot in day]
    lessons_in_order = list(dict.fromkeys(order))
    assert lessons_in_order.index("10") == lessons_in_order.index("06") + 1


def test_a_track_that_does_not_fit_its_day_is_refused_by_name():
    found = schedule.lessons()
    heavy = dataclasses.replace(found[0].sections[0],
                                meta={**found[0].sections[0].meta, "minutes": 400})
    too_long = [schedule.Lesson(found[0].number, found[0].title, 400, 0, False,
                                (heavy, *found[0].sections[1:])), *found[1:]]
    track = next(t for t in schedule.TRACKS if t.name == "ml")
    with pytest.raises(schedule.DoesNotFit,
                       match=r"Machine learning, one day: .* do not fit \(00 1\. What is"):
        schedule.pack(track, too_long)


def test_a_track_whose_conversion_comes_after_lunch_is_refused():
    track = next(t for t in schedule.TRACKS if t.name == "two-day")
    late = dataclasses.replace(track, order=tuple(n for n in track.order if n != "05") + ("05",))
    with pytest.raises(schedule.DoesNotFit, match=r"lesson 05's exercise 1 \(the DDP "
                       r"conversion\) does not end before lunch on day 1 \(not on day 1\)"):
        schedule.pack(late, schedule.lessons())


def test_the_learners_edition_folds_the_instructors_notes(built):
    """Every cell of an instructor's section is folded; nothing else that was shown is."""
    for name, (course, learners) in built.items():
        instructor = False
        for ours, theirs in zip(course.cells, learners.cells, strict=True):
            if ours.cell_type == "markdown" and sections.HEADING.fullmatch(
                    ours.source.split("\n", 1)[0]):
                instructor = ours.metadata.get(sections.KEY, {}).get("tier") == "instructor"
            if exercises.is_solution(ours):
                continue  # a stub, shown (test_stubs_are_python_and_replace_each_solution)
            hidden = theirs.metadata.get("jupyter", {}).get("source_hidden", False)
            was_hidden = ours.metadata.get("jupyter", {}).get("source_hidden", False)
            assert hidden == (instructor or was_hidden), (name, ours.source[:60])


@pytest.fixture(scope="module", params=[t.name for t in schedule.TRACKS])
def track_edition(request, tmp_path_factory) -> tuple[schedule.Track, dict[str, dict]]:
    """A track and its edition, lesson name -> notebook."""
    track = next(t for t in schedule.TRACKS if t.name == request.param)
    dest = tmp_path_factory.mktemp(track.name)
    exercises.build(dest, track=track)
    return track, {path.name: nbformat.read(dest / "notebooks" / path.name, as_version=4)
                   for path in NOTEBOOKS}


def appendix_start(notebook: dict) -> int:
    heads = [i for i, cell in enumerate(notebook.cells)
             if cell.cell_type == "markdown" and cell.source.startswith("## Appendix")]
    assert len(heads) <= 1
    return heads[0] if heads else len(notebook.cells)


def test_a_tracks_edition_keeps_its_sections_in_order_and_appends_the_rest(track_edition):
    """Before the appendix: the sections the schedule gives the track, in the lesson's order,
    instructor notes folded; after it: everything else, nothing runnable, nothing lost."""
    track, notebooks = track_edition
    chosen = schedule.slots(track, schedule.lessons())
    for path in NOTEBOOKS:
        course = exercises.edition(nbformat.read(path, as_version=4))
        ours = notebooks[path.name]
        nbformat.validate(ours)
        ids = [cell.id for cell in ours.cells]
        assert len(set(ids)) == len(ids), f"{path.name}: repeated cell ids"
        assert set(ids) <= {c.id for c in course.cells} | {"track-edition", "track-appendix"} | {
            f"{c.id}-title" for c in course.cells}, "ids from the lesson: each build the same"
        split = appendix_start(ours)
        day, rest = ours.cells[:split], ours.cells[split + 1:]
        headings = [c.source.split("\n", 1)[0] for c in day if c.cell_type == "markdown"
                    and sections.HEADING.fullmatch(c.source.split("\n", 1)[0])]
        expected = [f"## {s.section.title}" for s in chosen if s.lesson.number == path.name[:2]]
        unnumbered = [re.sub(r"^## \d+\. ", "## ", h) for h in headings]
        notes = [h for h in unnumbered if h not in map(unnumber, expected)]
        assert [h for h in unnumbered if h not in notes] == list(map(unnumber, expected)), \
            path.name
        assert all(h == "## Notes" for h in notes), (path.name, notes)
        assert all(c.cell_type != "code" for c in rest), "Run All runs nothing of the appendix"
        done = {e.number for s in chosen if s.lesson.number == path.name[:2] for e in s.exercises}
        kept = {int(m[1]) for c in day if c.cell_type == "markdown"
                and (m := sections.EXERCISE.match(c.source))}
        assert kept == done, (path.name, kept, done)
        # Every cell of the lesson is there once, in the day or in the appendix, and its code
        # as it was but for the sections' numbers.
        by_id = {c.id: c for c in ours.cells}
        numbers = edition_numbers(track)
        for cell in course.cells:
            assert cell.id in by_id, (path.name, cell.source[:80])
            if cell.cell_type == "code":
                assert by_id[cell.id].source == exercises.renumber(
                    cell.source, path.name[:2], numbers), (path.name, cell.source[:80])


def unnumber(heading: str) -> str:
    return re.sub(r"^## \d+\. ", "## ", heading)


def edition_numbers(track: schedule.Track) -> dict[str, dict[str, str]]:
    return schedule.edition_numbers(track, schedule.lessons())


def test_a_tracks_edition_numbers_its_sections_1_2_3(track_edition):
    track, notebooks = track_edition
    for name, notebook in notebooks.items():
        split = appendix_start(notebook)
        numbers = [int(m[1]) for c in notebook.cells[:split] if c.cell_type == "markdown"
                   and (m := re.match(r"## (\d+)\. ", c.source))]
        assert numbers == list(range(1, len(numbers) + 1)), (track.name, name, numbers)
        appendix = [c.source.split("\n", 1)[0] for c in notebook.cells[split:]
                    if c.cell_type == "markdown" and re.match(r"### A\d+\. ", c.source)]
        assert all(" · " in heading for heading in appendix), "tier and minutes"


def test_no_kept_cell_of_a_tracks_edition_cites_its_appendix(track_edition):
    """What the day keeps reads without the appendix: no cell of a lesson the track teaches
    cites a section of the appendix that comes before it in the lesson (as shown, measured,
    checked there), nor a script that only the appendix writes; no objective or key point
    stays that only the appendix shows. A pointer forward, to a section after it, stays: it
    says where to read on, and the edition names that section A and its number."""
    track, notebooks = track_edition
    for name, notebook in notebooks.items():
        if name[:2] not in track.order:
            continue  # the whole lesson is the appendix's
        split = appendix_start(notebook)
        day, rest = notebook.cells[:split], notebook.cells[split:]
        written = {m[1] for c in rest if (m := re.match(r"%%write_script (\S+)", c.source))}
        written -= {m[1] for c in day if (m := re.match(r"%%write_script (\S+)", c.source))}
        place, instructor = 0.0, False
        for index, cell in enumerate(day):
            heading = sections.HEADING.fullmatch(cell.source.split("\n", 1)[0]) \
                if cell.cell_type == "markdown" else None
            if heading:
                instructor = cell.metadata.get(sections.KEY, {}).get("tier") == "instructor"
                number = re.match(r"(\d+)\. ", heading[1])
                place = (original(track, name, number[1]) if number else
                         float("inf") if heading[1] in ("Key points", "Exercises") else
                         place + 0.5)
            if instructor:
                continue  # the instructor's notes speak of the whole lesson
            cited = [ref for ref in exercises.appendix_references(cell.source)
                     if any(int(n) < place for n in re.findall(r"A(\d+)", ref))]
            assert not cited, f"{track.name} edition of {name}, cell {index}: cites {cited}"
            scripts_cited = sorted(s for s in written if re.search(rf"\b{re.escape(s)}\b",
                                                                   cell.source))
            assert not scripts_cited, (f"{track.name} edition of {name}, cell {index}: names "
                                       f"{scripts_cited}, written only in the appendix")
            assert "<!-- sections:" not in cell.source, "the markers go"


def original(track: schedule.Track, name: str, label: str) -> float:
    """The number in the lesson of the section that the track's edition numbers ``label``."""
    table = schedule.edition_numbers(track, schedule.lessons())[name[:2]]
    return float(next(number for number, new in table.items() if new == label))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_objective_and_key_point_names_the_sections_that_show_it(path):
    notebook = nbformat.read(path, as_version=4)
    numbers = {s.number for s in sections.read(path)} - {None}
    lists = [notebook.cells[0].source] + [c.source for c in notebook.cells
                                          if c.source.startswith("## Key points")]
    for text in lists:
        for run in exercises.bullets(text):
            if run[0].startswith("- "):
                marker = exercises.SHOWN_BY.search(run[-1])
                assert marker, f"{path.name}: no <!-- sections: N --> after '{run[0][:60]}'"
                named = {n.strip() for n in marker[1].split(",")}
                assert named <= numbers | {"all"}, (path.name, run[0][:60], named)


def test_references_take_the_editions_numbers_and_bullets_follow_their_sections():
    numbers = {"05": {"2": "1", "3": "A3", "5": "2"}, "08": {"7": "A7", "2": "1"}}
    text = ("As section 5 shows (sections 2 and 3), and lesson 08, section 7, and lesson 08's "
            "section 2; Section 5.")
    assert exercises.renumber(text, "05", numbers) == (
        "As section 2 shows (sections 1 and A3), and lesson 08, section A7, and lesson 08's "
        "section 1; Section 2.")
    assert exercises.appendix_references(exercises.renumber(text, "05", numbers)) == [
        "sections 1 and A3"]
    text = ("Intro\n- one; <!-- sections: 2 -->\n- two,\n  on two lines. <!-- sections: 2, 3 -->"
            "\n- three <!-- sections: all -->\n\nEnd")
    kept, out = exercises.keep_bullets(text, {"2"})
    assert kept == "Intro\n- one;\n- three\n\nEnd"
    assert out == ["- two,\n  on two lines."]


def test_what_a_track_runs_needs_nothing_from_its_appendix(track_edition):
    """No cell Run All runs uses a name that only the appendix's cells define: a core section
    that leans on an optional one would fail in the track's edition."""
    track, notebooks = track_edition
    for name, notebook in notebooks.items():
        split = appendix_start(notebook)
        ran: set[str] = set()
        needs: list[tuple[int, set[str]]] = []
        for index, cell in enumerate(notebook.cells[:split]):
            if cell.cell_type == "code":
                defined, used = exercises.names(cell.source)
                needs.append((index, used - ran - defined))
                ran |= defined
        only_appendix = set()
        for cell in notebook.cells[split:]:
            with contextlib.suppress(SyntaxError):
                only_appendix |= exercises.names(cell.source)[0]
        only_appendix -= ran
        for index, missing in needs:
            assert not missing & only_appendix, (
                f"{track.name} edition of {name}, cell {index} uses "
                f"{sorted(missing & only_appendix)}, defined only in the appendix")


def test_a_tracks_edition_writes_every_script_the_course_writes(track_edition):
    """A cell that changes a script applies, in the edition as in the course, to the course's
    parent (renumbering a section touches only its ``+`` lines), and what it writes differs
    from the course's script at most in the section numbers of the lines it adds."""
    track, notebooks = track_edition
    checked = 0
    for name, notebook in notebooks.items():
        for cell in notebook.cells:
            first, _, body = cell.source.partition("\n")
            found = scripts.header(first)
            if cell.cell_type == "markdown" or not found or found[1] is None:
                continue
            written = scripts.script_of(first, body).splitlines()
            course = scripts.course_script(found[0]).splitlines()
            assert len(written) == len(course), f"{track.name} {name} {found[0]}"
            differ = [(a, b) for a, b in zip(written, course, strict=True) if a != b]
            assert all(re.sub(r"section A?\d+", "", a) == re.sub(r"section A?\d+", "", b)
                       for a, b in differ), f"{track.name} {name} {found[0]}: {differ}"
            checked += 1
    assert checked >= 15
