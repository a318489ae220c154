"""The largest compiled corpus programs (transformer training steps, LAMB) against their lowered
modules: the same judgement as test_corpus_compiled.py, kept apart because compiling them twice
takes over a minute."""

import pytest

from tests.test_corpus_compiled import COMPILED, LARGE, case_id, judge, program_dir


@pytest.mark.parametrize("path", [p for p in COMPILED if program_dir(p).name in LARGE], ids=case_id)
def test_large_compiled_module_verifies_against_lowered(path):
    judge(path)
