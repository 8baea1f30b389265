"""The Trainer's parts are declared in `__init__` (torchtitan's style): every `self.X = ...` in a method of
`albert_dist.apps.pretrain.trainer.Trainer` names an attribute `__init__` assigns (None until `setup()` builds it),
so the class says in one place what a trainer holds. Reads the source only (ast); nothing is imported or run."""
from __future__ import annotations

import ast
from pathlib import Path

TRAINER = Path(__file__).resolve().parents[2] / "albert_dist" / "apps" / "pretrain" / "trainer.py"


def self_assignments(function: ast.FunctionDef) -> dict[str, int]:
    """Attribute -> first line of every `self.<attribute> = / += / : T =` in `function` (nested functions and
    tuple targets included)."""
    found: dict[str, int] = {}
    for node in ast.walk(function):
        targets = (node.targets if isinstance(node, ast.Assign)
                   else [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else [])
        for target in targets:
            for part in ast.walk(target):
                if (isinstance(part, ast.Attribute) and isinstance(part.value, ast.Name)
                        and part.value.id == "self"):
                    found.setdefault(part.attr, part.lineno)
    return found


def undeclared(source: str, class_name: str = "Trainer") -> dict[str, str]:
    """Attributes assigned on self in a method of `class_name` other than `__init__` and never in `__init__`:
    attribute -> "method:line" of its first such assignment."""
    cls = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == class_name)
    methods = [f for f in cls.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))]
    declared = set(self_assignments(next(f for f in methods if f.name == "__init__")))
    late: dict[str, str] = {}
    for method in methods:
        if method.name != "__init__":
            for attr, line in self_assignments(method).items():
                if attr not in declared:
                    late.setdefault(attr, f"{method.name}:{line}")
    return late


def test_every_trainer_attribute_is_declared_in_init():
    late = undeclared(TRAINER.read_text())
    assert not late, f"Trainer attributes first assigned outside __init__ (declare them there): {late}"


def test_the_check_finds_a_late_attribute():
    """The check itself, on a planted class: a part first assigned in setup() (also in a nested function and a
    tuple target) is found; one declared in __init__ (even as None) is not."""
    planted = ("class Trainer:\n"
               "    def __init__(self):\n"
               "        self.engine = None\n"
               "    def setup(self):\n"
               "        self.engine = 1\n"
               "        self.device, self.step = 2, 3\n"
               "        def fetch():\n"
               "            self.fetched = 4\n"
               "    def train(self):\n"
               "        self.step += 1\n")
    assert undeclared(planted) == {"device": "setup:6", "step": "setup:6", "fetched": "setup:8"}
