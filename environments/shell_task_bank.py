"""The tasks of ``agentrl/ShellTasks-v0``: written for agentrl, one ``ShellTask`` each.

Every task has a setup (files written into the sandbox's working directory, then an
optional setup script), a prompt, checks (shell commands run in the sandbox after the
episode; exit status 0 = the criterion is met) and a reference solution (a bash script).
Tests prove, in the real sandbox, that every reference solution meets all checks and that
the untouched setup meets none.

The commands use only bash, coreutils, findutils, grep, sed, awk, tar, gzip and python3
(standard library), so any sandbox image with those runs them.
"""

from __future__ import annotations

import base64
import shlex
from dataclasses import dataclass, field
from typing import Mapping

__all__ = ["ShellTask", "Check", "TASKS", "same"]


@dataclass(frozen=True)
class Check:
    """One criterion: ``description`` (shown to the model after the episode) and ``command``
    (``bash -c``; exit 0 = met)."""

    description: str
    command: str


@dataclass(frozen=True)
class ShellTask:
    """One task. ``files`` maps paths relative to the working directory to contents;
    ``setup`` runs after they are written (bash, in the working directory)."""

    task_id: str
    category: str
    prompt: str
    checks: tuple[Check, ...]
    solution: str
    files: Mapping[str, str] = field(default_factory=dict)
    setup: str = ""


def same(path: str, expected: str) -> str:
    """A check command: the file at ``path`` holds ``expected`` (trailing newlines ignored)."""
    b64 = base64.b64encode(expected.encode()).decode()
    p = shlex.quote(path)
    return f'test -f {p} && [ "$(cat {p})" = "$(printf %s {b64} | base64 -d)" ]'


def _t(task_id: str, category: str, prompt: str, checks: list[tuple[str, str]], solution: str,
       files: Mapping[str, str] | None = None, setup: str = "") -> ShellTask:
    return ShellTask(
        task_id=f"shell/{task_id}", category=category, prompt=prompt.strip(),
        checks=tuple(Check(d, c) for d, c in checks), solution=solution.strip() + "\n",
        files=dict(files or {}), setup=setup,
    )


_LOG = """2024-05-01 10:00:01 INFO server started
2024-05-01 10:00:05 ERROR database timeout
2024-05-01 10:01:00 WARN slow request /api/items
2024-05-01 10:02:13 ERROR disk full on /var
2024-05-01 10:03:00 INFO request /api/users
2024-05-01 10:04:44 ERROR database timeout
2024-05-01 10:05:00 INFO shutting down
"""
_ACCESS = """10.0.0.1 - - [01/May/2024] "GET / HTTP/1.1" 200
10.0.0.2 - - [01/May/2024] "GET /a HTTP/1.1" 404
10.0.0.3 - - [01/May/2024] "GET /b HTTP/1.1" 200
10.0.0.2 - - [01/May/2024] "GET /c HTTP/1.1" 200
10.0.0.2 - - [01/May/2024] "POST /d HTTP/1.1" 500
10.0.0.3 - - [01/May/2024] "GET / HTTP/1.1" 200
"""
_SALES = "date,item,amount,country\n2024-01-02,pen,3.50,FR\n2024-01-03,book,12.00,DE\n2024-01-05,lamp,20.25,FR\n2024-01-09,cup,4.75,IT\n2024-01-11,desk,150.00,FR\n"
_TEXT = "the cat sat on the mat\nthe dog sat on the log\na cat and a dog\n"

TASKS: tuple[ShellTask, ...] = (
    # ---------------------------------------------------------------- files
    _t("make_dirs", "files",
       "Create the directories `reports/2024/q1` and `reports/2024/q2` in the working directory.",
       [("reports/2024/q1 is a directory", "test -d reports/2024/q1"),
        ("reports/2024/q2 is a directory", "test -d reports/2024/q2")],
       "mkdir -p reports/2024/q1 reports/2024/q2"),
    _t("rename_ext", "files",
       "Rename every `.txt` file in `notes/` to the same name with the extension `.md` (keep the contents).",
       [("no .txt file left in notes/", "test -d notes && ! ls notes/*.txt >/dev/null 2>&1 && test -f notes/a.md"),
        ("notes/a.md, b.md, c.md keep their contents", same("notes/a.md", "alpha") + " && " + same("notes/b.md", "beta") + " && " + same("notes/c.md", "gamma"))],
       'cd notes && for f in *.txt; do mv "$f" "${f%.txt}.md"; done',
       {"notes/a.txt": "alpha\n", "notes/b.txt": "beta\n", "notes/c.txt": "gamma\n"}),
    _t("copy_tree", "files",
       "Make `backup/` an exact copy of the directory `src/` (all files and subdirectories).",
       [("backup/ equals src/", "test -d backup && diff -r src backup >/dev/null")],
       "cp -r src backup",
       {"src/main.py": "print('hi')\n", "src/lib/util.py": "X = 1\n", "src/lib/data/config.txt": "k=v\n"}),
    _t("delete_tmp", "files",
       "Delete every file whose name ends in `.tmp` anywhere under `build/`, and nothing else.",
       [("no .tmp file under build/, the 3 other files kept",
         "[ -z \"$(find build -name '*.tmp')\" ] && [ \"$(find build -type f | wc -l)\" = 3 ]")],
       "find build -name '*.tmp' -type f -delete",
       {"build/a.o": "x", "build/a.tmp": "x", "build/sub/b.tmp": "x", "build/sub/b.o": "x",
        "build/sub/deep/c.tmp": "x", "build/keep.txt": "x"}),
    _t("empty_files", "files",
       "Write the names (just the file name, no directory) of the empty files in `data/` to `empty.txt`, one per line, sorted alphabetically.",
       [("empty.txt lists b.dat, d.dat", same("empty.txt", "b.dat\nd.dat\n"))],
       "find data -maxdepth 1 -type f -empty -printf '%f\\n' | sort > empty.txt",
       {"data/a.dat": "1\n", "data/b.dat": "", "data/c.dat": "22\n", "data/d.dat": ""}),
    _t("largest_file", "files",
       "Find the largest file (in bytes) in `data/` and write its file name (without the directory) to `largest.txt`.",
       [("largest.txt says big.bin", same("largest.txt", "big.bin"))],
       "ls -S data | head -n1 > largest.txt",
       {"data/small.txt": "x" * 10, "data/big.bin": "y" * 500, "data/mid.csv": "z" * 100}),
    _t("make_executable", "files",
       "Make every `.sh` file in `scripts/` executable, then run `scripts/setup.sh` once (it creates `ready.flag`).",
       [("all scripts executable", "test -x scripts/setup.sh && test -x scripts/run.sh"),
        ("ready.flag created by setup.sh", same("ready.flag", "ready"))],
       "chmod +x scripts/*.sh && ./scripts/setup.sh",
       {"scripts/setup.sh": "#!/bin/bash\necho ready > ready.flag\n", "scripts/run.sh": "#!/bin/bash\necho run\n"}),
    _t("symlink_latest", "files",
       "Create a symbolic link named `latest` in the working directory that points to `releases/v3`.",
       [("latest is a symlink to releases/v3", "test -L latest && [ \"$(readlink latest)\" = releases/v3 ] && test -f latest/VERSION")],
       "ln -s releases/v3 latest",
       {"releases/v1/VERSION": "1\n", "releases/v2/VERSION": "2\n", "releases/v3/VERSION": "3\n"}),
    _t("sort_by_type", "files",
       "Move the files in `inbox/` into `images/` (files ending in `.png` or `.jpg`) and `docs/` (files ending in `.pdf` or `.txt`). `inbox/` must end up empty.",
       [("images/ holds cat.png, dog.jpg", "[ \"$(ls images 2>/dev/null | tr '\\n' ' ')\" = 'cat.png dog.jpg ' ]"),
        ("docs/ holds cv.pdf, notes.txt", "[ \"$(ls docs 2>/dev/null | tr '\\n' ' ')\" = 'cv.pdf notes.txt ' ]"),
        ("inbox/ is empty", "test -d inbox && [ -z \"$(ls -A inbox)\" ]")],
       "mkdir -p images docs && mv inbox/*.png inbox/*.jpg images/ && mv inbox/*.pdf inbox/*.txt docs/",
       {"inbox/cat.png": "p", "inbox/dog.jpg": "j", "inbox/cv.pdf": "d", "inbox/notes.txt": "t"}),
    _t("count_files", "files",
       "Count the regular files under `project/` (recursively, all depths) and write the number to `count.txt`.",
       [("count.txt says 6", same("count.txt", "6"))],
       "find project -type f | wc -l > count.txt",
       {"project/a": "", "project/b": "", "project/x/c": "", "project/x/y/d": "", "project/x/y/e": "", "project/z/f": ""}),
    _t("newest_file", "files",
       "Write the name (without directory) of the most recently modified file in `logs/` to `newest.txt`.",
       [("newest.txt says tuesday.log", same("newest.txt", "tuesday.log"))],
       "ls -t logs | head -n1 > newest.txt",
       {"logs/monday.log": "m", "logs/tuesday.log": "t", "logs/sunday.log": "s"},
       setup="touch -d '2024-01-01 10:00' logs/monday.log; touch -d '2024-01-02 10:00' logs/tuesday.log; touch -d '2023-12-31 10:00' logs/sunday.log"),
    _t("remove_duplicates", "files",
       "Some files in `photos/` have identical contents. Delete duplicates so that each distinct content remains exactly once, keeping the alphabetically first file name of each group.",
       [("exactly a.jpg, c.jpg, d.jpg remain", "[ \"$(ls photos | tr '\\n' ' ')\" = 'a.jpg c.jpg d.jpg ' ]")],
       "cd photos && md5sum * | sort -k2 | awk 'seen[$1]++ {print $2}' | xargs -r rm --",
       {"photos/a.jpg": "sun", "photos/b.jpg": "sun", "photos/c.jpg": "moon", "photos/d.jpg": "star", "photos/e.jpg": "moon"}),
    _t("make_archive", "files",
       "Create a gzip-compressed tar archive `logs.tar.gz` containing the directory `logs/` (paths inside the archive start with `logs/`).",
       [("logs.tar.gz holds logs/a.log and logs/b.log with their contents",
         "d=$(mktemp -d) && tar -xzf logs.tar.gz -C \"$d\" && diff -r logs \"$d/logs\" >/dev/null")],
       "tar -czf logs.tar.gz logs",
       {"logs/a.log": "first\n", "logs/b.log": "second\n"}),
    _t("extract_archive", "files",
       "Extract the archive `bundle.tar.gz` into a new directory `out/`, then write the contents of the file `secret.txt` found inside it to `answer.txt`.",
       [("out/ holds the extracted files", "test -f out/bundle/secret.txt || test -f out/secret.txt"),
        ("answer.txt holds the secret", same("answer.txt", "tangerine-42"))],
       "mkdir -p out && tar -xzf bundle.tar.gz -C out && cat \"$(find out -name secret.txt)\" > answer.txt",
       {"pkg/bundle/secret.txt": "tangerine-42\n", "pkg/bundle/readme": "read me\n"},
       setup="tar -czf bundle.tar.gz -C pkg bundle && rm -r pkg"),
    _t("replace_in_configs", "files",
       "In every `.cfg` file under `conf/` (any depth), replace each occurrence of `localhost` with `db.internal`. Do not change other files.",
       [("no .cfg file mentions localhost", "! grep -rq localhost --include='*.cfg' conf"),
        ("the .cfg files now say db.internal", same("conf/app.cfg", "host=db.internal\nport=5432") + " && " + same("conf/sub/worker.cfg", "upstream=db.internal:80 # localhost was here".replace("localhost", "db.internal"))),
        ("notes.txt unchanged", "test \"$(find conf -name '*.cfg' -exec grep -l db.internal {} + | wc -l)\" = 2 && " + same("conf/notes.txt", "run on localhost"))],
       "find conf -name '*.cfg' -exec sed -i 's/localhost/db.internal/g' {} +",
       {"conf/app.cfg": "host=localhost\nport=5432\n", "conf/sub/worker.cfg": "upstream=localhost:80 # localhost was here\n", "conf/notes.txt": "run on localhost\n"}),
    # ---------------------------------------------------------------- text
    _t("count_lines", "text",
       "Write the number of lines of `data.txt` to `lines.txt` (just the number).",
       [("lines.txt says 5", same("lines.txt", "5"))],
       "wc -l < data.txt > lines.txt",
       {"data.txt": "a\nb\nc\nd\ne\n"}),
    _t("top_word", "text",
       "Find the most frequent word in `text.txt` (words are separated by spaces or newlines) and write it to `top_word.txt`.",
       [("top_word.txt says the", same("top_word.txt", "the"))],
       "tr ' ' '\\n' < text.txt | grep -v '^$' | sort | uniq -c | sort -rn | head -n1 | awk '{print $2}' > top_word.txt",
       {"text.txt": _TEXT}),
    _t("sort_unique", "text",
       "Write the distinct names of `names.txt`, sorted alphabetically, one per line, to `sorted.txt`.",
       [("sorted.txt is right", same("sorted.txt", "alice\nbob\ncarol\ndave"))],
       "sort -u names.txt > sorted.txt",
       {"names.txt": "carol\nalice\nbob\nalice\ndave\ncarol\n"}),
    _t("csv_sum", "text",
       "`sales.csv` has a header line and a column `amount`. Write the sum of that column, with exactly two decimals (e.g. `12.30`), to `total.txt`.",
       [("total.txt says 190.50", same("total.txt", "190.50"))],
       "awk -F, 'NR>1 {s+=$3} END {printf \"%.2f\\n\", s}' sales.csv > total.txt",
       {"sales.csv": _SALES}),
    _t("csv_filter", "text",
       "Write to `fr.csv` the header line of `sales.csv` followed by the rows whose `country` is `FR`, in their original order.",
       [("fr.csv is right", same("fr.csv", "date,item,amount,country\n2024-01-02,pen,3.50,FR\n2024-01-05,lamp,20.25,FR\n2024-01-11,desk,150.00,FR"))],
       "awk -F, 'NR==1 || $4==\"FR\"' sales.csv > fr.csv",
       {"sales.csv": _SALES}),
    _t("count_errors", "text",
       "Count the lines of `app.log` whose level is `ERROR` and write the number to `errors.txt`.",
       [("errors.txt says 3", same("errors.txt", "3"))],
       "grep -c ' ERROR ' app.log > errors.txt",
       {"app.log": _LOG}),
    _t("error_messages", "text",
       "Write the distinct messages of the `ERROR` lines of `app.log` (the text after the level), sorted alphabetically, one per line, to `messages.txt`.",
       [("messages.txt is right", same("messages.txt", "database timeout\ndisk full on /var"))],
       "grep ' ERROR ' app.log | sed 's/^.* ERROR //' | sort -u > messages.txt",
       {"app.log": _LOG}),
    _t("top_ip", "text",
       "`access.log` is a web server log whose first field is the client IP. Write the IP with the most requests to `top_ip.txt`.",
       [("top_ip.txt says 10.0.0.2", same("top_ip.txt", "10.0.0.2"))],
       "awk '{print $1}' access.log | sort | uniq -c | sort -rn | head -n1 | awk '{print $2}' > top_ip.txt",
       {"access.log": _ACCESS}),
    _t("status_counts", "text",
       "For `access.log` (the last field is the HTTP status), write to `status.txt` one line per status code with the code and its number of requests separated by a space, sorted by code (e.g. `200 7`).",
       [("status.txt is right", same("status.txt", "200 4\n404 1\n500 1"))],
       "awk '{c[$NF]++} END {for (k in c) print k, c[k]}' access.log | sort > status.txt",
       {"access.log": _ACCESS}),
    _t("json_filter", "text",
       "`users.json` is a JSON list of objects with `name` and `age`. Write the names of the users older than 30, sorted alphabetically, one per line, to `older.txt`.",
       [("older.txt is right", same("older.txt", "Ann\nZoe"))],
       "python3 -c 'import json; print(\"\\n\".join(sorted(u[\"name\"] for u in json.load(open(\"users.json\")) if u[\"age\"] > 30)))' > older.txt",
       {"users.json": '[{"name": "Zoe", "age": 41}, {"name": "Bob", "age": 30}, {"name": "Ann", "age": 35}, {"name": "Cid", "age": 19}]\n'}),
    _t("reverse_lines", "text",
       "Write the lines of `poem.txt` in reverse order (last line first) to `reversed.txt`.",
       [("reversed.txt is right", same("reversed.txt", "three\ntwo\none"))],
       "tac poem.txt > reversed.txt",
       {"poem.txt": "one\ntwo\nthree\n"}),
    _t("uppercase", "text",
       "Write `shout.txt` with the contents of `quiet.txt` converted to upper case.",
       [("shout.txt is right", same("shout.txt", "HELLO THERE\nGENERAL KENOBI"))],
       "tr '[:lower:]' '[:upper:]' < quiet.txt > shout.txt",
       {"quiet.txt": "hello there\ngeneral kenobi\n"}),
    _t("remove_blank_lines", "text",
       "Remove the blank lines (empty or only spaces) from `draft.txt`, in place.",
       [("draft.txt has no blank lines and keeps the others", same("draft.txt", "title\nbody one\nbody two\nend"))],
       "sed -i '/^[[:space:]]*$/d' draft.txt",
       {"draft.txt": "title\n\nbody one\n   \nbody two\n\n\nend\n"}),
    _t("extract_emails", "text",
       "Extract every email address from `contacts.txt` and write them to `emails.txt`, distinct, sorted, one per line.",
       [("emails.txt is right", same("emails.txt", "ann@example.com\nbob.smith@mail.org\nzed@site.net"))],
       "grep -oE '[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\\.[A-Za-z]+' contacts.txt | sort -u > emails.txt",
       {"contacts.txt": "Ann <ann@example.com>, phone 123\nBob: bob.smith@mail.org\nwrite to zed@site.net or ann@example.com\n"}),
    _t("swap_columns", "text",
       "`pairs.tsv` has two tab-separated columns. Write `swapped.tsv` with the columns swapped (still tab-separated).",
       [("swapped.tsv is right", same("swapped.tsv", "1\ta\n2\tb\n3\tc"))],
       "awk -F'\\t' -v OFS='\\t' '{print $2, $1}' pairs.tsv > swapped.tsv",
       {"pairs.tsv": "a\t1\nb\t2\nc\t3\n"}),
    _t("longest_line", "text",
       "Write the longest line of `poem.txt` to `longest.txt`.",
       [("longest.txt is right", same("longest.txt", "the longest line of them all"))],
       "awk '{ if (length($0) > max) {max = length($0); l = $0} } END {print l}' poem.txt > longest.txt",
       {"poem.txt": "short\na bit longer line\nthe longest line of them all\nmedium line here\n"}),
    _t("edit_ini", "text",
       "In `app.ini`, change the value of `port` from 80 to 8080. Keep every other line unchanged.",
       [("app.ini has port=8080 and nothing else changed", same("app.ini", "[server]\nhost=0.0.0.0\nport=8080\n[client]\nretries=80"))],
       "sed -i 's/^port=80$/port=8080/' app.ini",
       {"app.ini": "[server]\nhost=0.0.0.0\nport=80\n[client]\nretries=80\n"}),
    _t("join_files", "text",
       "`ids.txt` has lines `id name`, `scores.txt` has lines `id score`. Write `joined.txt` with lines `name score` for every id present in both, sorted by name.",
       [("joined.txt is right", same("joined.txt", "ana 91\nbea 78\ncarl 85"))],
       "join <(sort ids.txt) <(sort scores.txt) | awk '{print $2, $3}' | sort > joined.txt",
       {"ids.txt": "3 carl\n1 ana\n2 bea\n4 dan\n", "scores.txt": "1 91\n2 78\n3 85\n5 60\n"}),
    _t("dedupe_keep_order", "text",
       "Write to `unique.txt` the lines of `visits.txt` with duplicates removed, keeping the first occurrence of each line and the original order.",
       [("unique.txt is right", same("unique.txt", "home\nabout\ncart\ncheckout"))],
       "awk '!seen[$0]++' visits.txt > unique.txt",
       {"visits.txt": "home\nabout\nhome\ncart\nabout\ncheckout\ncart\n"}),
    _t("word_counts", "text",
       "For each `.txt` file in `docs/`, write a line `<file name> <number of words>` to `counts.txt`, sorted by file name.",
       [("counts.txt is right", same("counts.txt", "a.txt 3\nb.txt 5\nc.txt 1"))],
       "cd docs && for f in *.txt; do echo \"$f $(wc -w < \"$f\")\"; done > ../counts.txt",
       {"docs/a.txt": "one two three\n", "docs/b.txt": "a b c\nd e\n", "docs/c.txt": "single\n"}),
    _t("strip_trailing_ws", "text",
       "Remove trailing spaces and tabs at the end of every line of every `.py` file under `code/`, in place.",
       [("no trailing whitespace in .py files", "test -d code && ! grep -rqE '[[:blank:]]+$' --include='*.py' code && " + same("code/main.py", "def f():\n    return 1"))],
       "find code -name '*.py' -exec sed -i 's/[[:blank:]]*$//' {} +",
       {"code/main.py": "def f():  \n    return 1\t\n", "code/pkg/mod.py": "X = 2   \n"}),
    # ---------------------------------------------------------------- programs
    _t("hello_script", "programs",
       "Write an executable bash script `hello.sh` that prints exactly `Hello, World!`.",
       [("./hello.sh prints Hello, World!", "test -x hello.sh && [ \"$(./hello.sh)\" = 'Hello, World!' ]")],
       "printf '#!/bin/bash\\necho \"Hello, World!\"\\n' > hello.sh && chmod +x hello.sh"),
    _t("fizzbuzz", "programs",
       "Write `fizzbuzz.py`: `python3 fizzbuzz.py N` prints the numbers 1..N, one per line, but `Fizz` for multiples of 3, `Buzz` for multiples of 5 and `FizzBuzz` for multiples of both.",
       [("N=15 is right", "[ \"$(python3 fizzbuzz.py 15 | tr '\\n' ' ')\" = '1 2 Fizz 4 Buzz Fizz 7 8 Fizz Buzz 11 Fizz 13 14 FizzBuzz ' ]"),
        ("N=1 is right", "[ \"$(python3 fizzbuzz.py 1)\" = 1 ]")],
       "cat > fizzbuzz.py <<'EOF'\nimport sys\nfor i in range(1, int(sys.argv[1]) + 1):\n    print('FizzBuzz' if i % 15 == 0 else 'Fizz' if i % 3 == 0 else 'Buzz' if i % 5 == 0 else i)\nEOF"),
    _t("add_script", "programs",
       "Write an executable bash script `add.sh` that prints the sum of its two integer arguments (e.g. `./add.sh 2 3` prints `5`).",
       [("./add.sh 2 3 prints 5", "test -x add.sh && [ \"$(./add.sh 2 3)\" = 5 ]"),
        ("./add.sh -7 100 prints 93", "test -x add.sh && [ \"$(./add.sh -7 100)\" = 93 ]")],
       "printf '#!/bin/bash\\necho $(( $1 + $2 ))\\n' > add.sh && chmod +x add.sh"),
    _t("fix_factorial", "programs",
       "`calc.py` should print the factorial of its argument (`python3 calc.py 5` prints `120`) but has a bug. Fix it.",
       [("python3 calc.py 5 prints 120", "[ \"$(python3 calc.py 5)\" = 120 ]"),
        ("python3 calc.py 0 prints 1", "grep -q 'def factorial' calc.py && [ \"$(python3 calc.py 1)\" = 1 ] && [ \"$(python3 calc.py 0)\" = 1 ] && [ \"$(python3 calc.py 6)\" = 720 ]")],
       "sed -i 's/range(1, n)/range(1, n + 1)/' calc.py",
       {"calc.py": "import sys\n\n\ndef factorial(n):\n    result = 1\n    for i in range(1, n):\n        result *= i\n    return result\n\n\nprint(factorial(int(sys.argv[1])))\n"}),
    _t("primes", "programs",
       "Write `primes.py`: `python3 primes.py N` prints the prime numbers smaller than N, one per line, in increasing order.",
       [("N=30 is right", "[ \"$(python3 primes.py 30 | tr '\\n' ' ')\" = '2 3 5 7 11 13 17 19 23 29 ' ]"),
        ("N=2 prints nothing", "test -f primes.py && [ -z \"$(python3 primes.py 2)\" ]")],
       "cat > primes.py <<'EOF'\nimport sys\nn = int(sys.argv[1])\nfor k in range(2, n):\n    if all(k % d for d in range(2, int(k ** 0.5) + 1)):\n        print(k)\nEOF"),
    _t("palindrome", "programs",
       "Write an executable bash script `pal.sh` that prints `yes` if its argument reads the same backwards, else `no`.",
       [("racecar -> yes, level -> yes", "test -x pal.sh && [ \"$(./pal.sh racecar)\" = yes ] && [ \"$(./pal.sh level)\" = yes ]"),
        ("hello -> no", "test -x pal.sh && [ \"$(./pal.sh hello)\" = no ]")],
       "printf '#!/bin/bash\\nif [ \"$1\" = \"$(echo \"$1\" | rev)\" ]; then echo yes; else echo no; fi\\n' > pal.sh && chmod +x pal.sh"),
    _t("csv_to_json", "programs",
       "Convert `people.csv` (header `name,city`) to `people.json`: a JSON list of objects with keys `name` and `city`, in file order.",
       [("people.json is right",
         "python3 -c 'import json,sys; sys.exit(json.load(open(\"people.json\")) != [{\"name\": \"Ann\", \"city\": \"Oslo\"}, {\"name\": \"Bo\", \"city\": \"Rome\"}])'")],
       "python3 -c 'import csv,json; json.dump(list(csv.DictReader(open(\"people.csv\"))), open(\"people.json\", \"w\"))'",
       {"people.csv": "name,city\nAnn,Oslo\nBo,Rome\n"}),
    _t("rot13", "programs",
       "Write an executable script `rot13.sh` that reads text on stdin and writes its ROT13 encoding (letters rotated by 13, other characters unchanged) on stdout. Then use it to decode `message.txt` into `plain.txt`.",
       [("rot13.sh encodes", "test -x rot13.sh && [ \"$(echo 'Hello, World' | ./rot13.sh)\" = 'Uryyb, Jbeyq' ]"),
        ("plain.txt is decoded", same("plain.txt", "meet me at noon"))],
       "printf '#!/bin/bash\\ntr A-Za-z N-ZA-Mn-za-m\\n' > rot13.sh && chmod +x rot13.sh && ./rot13.sh < message.txt > plain.txt",
       {"message.txt": "zrrg zr ng abba\n"}),
    _t("word_count_program", "programs",
       "Write `wc.py`: it reads text on stdin and prints the number of lines, words and characters separated by single spaces (like `wc` without padding, e.g. `2 5 27`).",
       [("wc.py counts", "[ \"$(printf 'one two\\nthree four five\\n' | python3 wc.py)\" = '2 5 24' ]"),
        ("wc.py on empty input", "test -f wc.py && [ \"$(printf '' | python3 wc.py)\" = '0 0 0' ]")],
       "cat > wc.py <<'EOF'\nimport sys\ntext = sys.stdin.read()\nprint(text.count('\\n'), len(text.split()), len(text))\nEOF"),
    _t("env_report", "programs",
       "Write an executable bash script `report.sh` that prints `<name>=<size in bytes>` for every regular file in the directory given as its first argument, sorted by name. Then run it on `data/` and save its output to `report.txt`.",
       [("report.txt is right", same("report.txt", "a.txt=3\nb.txt=10")),
        ("report.sh works on another dir", "test -x report.sh && d=$(mktemp -d) && printf 12345 > \"$d/x\" && [ \"$(./report.sh \"$d\")\" = 'x=5' ]")],
       "printf '#!/bin/bash\\ncd \"$1\" && for f in *; do [ -f \"$f\" ] && echo \"$f=$(wc -c < \"$f\")\"; done\\n' > report.sh && chmod +x report.sh && ./report.sh data > report.txt",
       {"data/a.txt": "abc", "data/b.txt": "0123456789"}),
)
