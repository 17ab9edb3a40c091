"""Four programs per language of the program judge's table, for its tests and its benchmark.

``ok`` reads two integers and prints their sum; ``compile_error`` does not build (or does not pass
the syntax check), and ``message`` is a piece of what its compiler says; ``runtime_error`` builds
and fails as it runs; ``time_limit`` builds and spins forever. :func:`case` makes a submission of
one of them with the verdict it must get.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Programs:
    ok: str
    compile_error: str
    message: str
    runtime_error: str
    time_limit: str


PROGRAMS: dict[str, Programs] = {
    "c": Programs(
        # pid_t without <sys/types.h>: GNU C (the default) declares it through <unistd.h>.
        '#include <stdio.h>\n#include <unistd.h>\nint main(void) { pid_t a, b; scanf("%d %d", &a, &b);'
        ' printf("%d\\n", a + b); return 0; }\n',
        "int main(void) { return undeclared_thing; }\n",
        "undeclared_thing",
        "#include <stdlib.h>\nint main(void) { abort(); }\n",
        "int main(void) { volatile unsigned long i = 0; for (;;) i++; }\n",
    ),
    "cpp": Programs(
        "#include <iostream>\nint main() { long long a, b; std::cin >> a >> b; std::cout << a + b << '\\n'; }\n",
        "int main() { undeclared_thing(); }\n",
        "undeclared_thing",
        "#include <vector>\nint main() { std::vector<int> v; return v.at(3); }\n",
        "int main() { volatile unsigned long i = 0; for (;;) i++; }\n",
    ),
    "java": Programs(
        # Any public class name, as Kattis and Codeforces take it.
        "import java.util.*;\n\npublic class Solution {\n  public static void main(String[] args) {\n"
        "    Scanner s = new Scanner(System.in);\n    System.out.println(s.nextLong() + s.nextLong());\n  }\n}\n",
        'public class Broken { public static void main(String[] a) { int x = "text"; } }\n',
        "incompatible types",
        "public class Crash { public static void main(String[] a) { int[] x = new int[1]; x[2] = 1; } }\n",
        "public class Spin { public static void main(String[] a) { long i = 0; while (true) i++; } }\n",
    ),
    "kotlin": Programs(
        'fun main() {\n  val (a, b) = readLine()!!.trim().split(" ").map { it.toLong() }\n  println(a + b)\n}\n',
        'fun main() {\n  val x: Int = "text"\n}\n',
        "type mismatch",
        "fun main() {\n  val xs = IntArray(1)\n  println(xs[2])\n}\n",
        "fun main() {\n  var i = 0L\n  while (true) i++\n}\n",
    ),
    "scala": Programs(
        "object Sum {\n  def main(args: Array[String]): Unit = {\n"
        '    val Array(a, b) = scala.io.StdIn.readLine().trim.split(" ").map(_.toLong)\n    println(a + b)\n  }\n}\n',
        'object Main {\n  def main(args: Array[String]): Unit = {\n    val x: Int = "text"\n  }\n}\n',
        "Found:",
        "object Main {\n  def main(args: Array[String]): Unit = {\n    val xs = new Array[Int](1)\n"
        "    println(xs(2))\n  }\n}\n",
        "object Main {\n  def main(args: Array[String]): Unit = {\n    var i = 0L\n    while (true) i += 1\n  }\n}\n",
    ),
    "python": Programs(
        "a, b = map(int, input().split())\nprint(a + b)\n",
        "print(1 +)\n",
        "SyntaxError",
        "raise SystemExit(3)\n",
        "while True:\n    pass\n",
    ),
    "pypy": Programs(
        "a, b = map(int, input().split())\nprint(a + b)\n",
        "print(1 +)\n",
        "SyntaxError",
        "print([1][2])\n",
        "i = 0\nwhile True:\n    i += 1\n",
    ),
    "go": Programs(
        'package main\n\nimport "fmt"\n\nfunc main() {\n\tvar a, b int64\n\tfmt.Scan(&a, &b)\n'
        "\tfmt.Println(a + b)\n}\n",
        'package main\n\nfunc main() {\n\tvar x int = "text"\n}\n',
        "cannot use",
        "package main\n\nfunc main() {\n\tvar xs []int\n\tprintln(xs[3])\n}\n",
        "package main\n\nfunc main() {\n\ti := 0\n\tfor {\n\t\ti++\n\t}\n}\n",
    ),
    "rust": Programs(
        "use std::io::Read;\nfn main() {\n    let mut s = String::new();\n"
        "    std::io::stdin().read_to_string(&mut s).unwrap();\n"
        "    let v: Vec<i64> = s.split_whitespace().map(|x| x.parse().unwrap()).collect();\n"
        '    println!("{}", v[0] + v[1]);\n}\n',
        'fn main() {\n    let x: i32 = "text";\n}\n',
        "mismatched types",
        'fn main() {\n    let v: Vec<i32> = Vec::new();\n    println!("{}", v[std::env::args().count() + 2]);\n}\n',
        "fn main() {\n    let mut i: u64 = 0;\n    loop {\n        i = std::hint::black_box(i + 1);\n    }\n}\n",
    ),
    "javascript": Programs(
        "const [a, b] = require('fs').readFileSync(0, 'utf8').trim().split(/\\s+/).map(Number);\nconsole.log(a + b);\n",
        "const x = ;\n",
        "SyntaxError",
        "null.field;\n",
        "let i = 0;\nfor (;;) i++;\n",
    ),
    "ruby": Programs(
        "a, b = gets.split.map(&:to_i)\nputs a + b\n",
        "def f(\n",
        "syntax error",
        "raise 'boom'\n",
        "i = 0\nloop { i += 1 }\n",
    ),
    "php": Programs(
        "<?php\n[$a, $b] = array_map('intval', preg_split('/\\s+/', trim(fgets(STDIN))));\necho $a + $b, \"\\n\";\n",
        "<?php\necho 1 +;\n",
        "syntax error",
        "<?php\nthrow new Exception('boom');\n",
        "<?php\n$i = 0;\nwhile (true) { $i++; }\n",
    ),
    "perl": Programs(
        "my ($a, $b) = split ' ', <STDIN>;\nprint $a + $b, \"\\n\";\n",
        "my $x = ;\n",
        "syntax error",
        'die "boom\\n";\n',
        "my $i = 0;\nwhile (1) { $i++ }\n",
    ),
    "haskell": Programs(
        "main :: IO ()\nmain = do\n  [a, b] <- map read . words <$> getLine\n  print (a + b :: Integer)\n",
        "main :: IO ()\nmain = putStrLn (1 :: Int)\n",
        "Couldn't match",
        "main :: IO ()\nmain = print (head ([] :: [Int]))\n",
        "loop :: Int -> Int\nloop n = if n < 0 then n else loop (n + 1)\n\nmain :: IO ()\nmain = print (loop 0)\n",
    ),
    "ocaml": Programs(
        'let () = Scanf.scanf " %d %d" (fun a b -> Printf.printf "%d\\n" (a + b))\n',
        'let () = print_int "text"\n',
        "This expression has type",
        "let () = print_int (List.hd [])\n",
        "let rec loop n = if n < 0 then n else loop (n + 1)\nlet () = print_int (loop 0)\n",
    ),
    "pascal": Programs(
        "var a, b: int64;\nbegin\n  readln(a, b);\n  writeln(a + b);\nend.\n",
        "begin\n  undeclared_thing := 1;\nend.\n",
        "undeclared_thing",
        "var a: array[1..2] of longint; i: longint;\nbegin\n  i := 0;\n  halt(3);\n  writeln(a[i]);\nend.\n",
        "var i: int64;\nbegin\n  i := 0;\n  while true do inc(i);\nend.\n",
    ),
    "lisp": Programs(
        '(let ((a (read)) (b (read))) (format t "~a~%" (+ a b)))\n',
        "(defun f (x) (+ x 1)\n",
        "end of file",
        '(error "boom")\n',
        "(loop)\n",
    ),
    "prolog": Programs(
        "main :- read_term(user_input, A, []), read_term(user_input, B, []), C is A + B, write(C), nl.\n",
        "main :- write(hello.\n",
        "Syntax error",
        "main :- X is 1 / 0, write(X), nl.\n",
        "loop(N) :- M is N + 1, loop(M).\nmain :- loop(0).\n",
    ),
}

#: Input and expected output of every ``ok`` program (Prolog reads terms: each ends with a full stop).
OK_INPUT = {"prolog": "2.\n3.\n"}
DEFAULT_INPUT = "2 3\n"
OK_OUTPUT = "5\n"

#: The verdict each case of :class:`Programs` gets in a :func:`payload`; ``wrong_answer`` is the
#: ``ok`` program told to expect another sum.
VERDICTS = {"ok": "ACCEPTED", "wrong_answer": "WRONG_ANSWER", "compile_error": "COMPILE_ERROR",
            "runtime_error": "RUNTIME_ERROR", "time_limit": "TIME_LIMIT"}  # fmt: skip


def payload(language: str, source: str, *, output: str = OK_OUTPUT, **extra: Any) -> dict[str, Any]:
    """A program-judge submission of ``source`` with one test: the two numbers in, ``output`` expected."""
    given = OK_INPUT.get(language, DEFAULT_INPUT)
    return {
        "language": language, "source": source, "tests": [{"input": given, "output": output}],
        "limits": {"time": 1, "memory_mb": 256}, **extra,
    }  # fmt: skip


def case(language: str, name: str) -> tuple[dict[str, Any], str]:
    """The submission of case ``name`` (a key of :data:`VERDICTS`) in ``language``, and its verdict."""
    programs = PROGRAMS[language]
    if name == "wrong_answer":
        return payload(language, programs.ok, output="6\n"), VERDICTS[name]
    return payload(language, getattr(programs, name)), VERDICTS[name]
