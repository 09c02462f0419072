"""Reading submissions as editors save them: a byte-order mark, Windows line endings, broken
JSON that says where it broke."""
import json

import pytest

from grader import notebook
from grader.errors import GraderError
from tests.conftest import FIXTURES

TOY = FIXTURES / "notebooks" / "90_toy.ipynb"


def test_a_byte_order_mark_before_the_json_is_read(tmp_path):
    path = tmp_path / "bom.ipynb"
    path.write_bytes(b"\xef\xbb\xbf" + TOY.read_bytes())
    assert [c.id for c in notebook.read(path).cells] == [c.id for c in notebook.read(TOY).cells]


def test_windows_line_endings_in_cell_text_read_as_newlines(tmp_path):
    data = json.loads(TOY.read_text())
    for cell in data["cells"]:
        cell["source"] = [line.replace("\n", "\r\n") for line in cell["source"]]
    path = tmp_path / "crlf.ipynb"
    path.write_text(json.dumps(data))
    assert [c.source for c in notebook.read(path).cells] == \
        [c.source for c in notebook.read(TOY).cells]


def test_broken_json_names_line_and_column_and_the_remedy_without_quoting_it(tmp_path):
    path = tmp_path / "comma.ipynb"
    path.write_text('{"cells": [],\n "metadata": {"secret": "do-not-quote"},\n}')
    with pytest.raises(GraderError) as info:
        notebook.read(path)
    message = str(info.value)
    assert "it is not JSON: Expecting property name enclosed in double quotes at line 3, " \
           "column 1" in message
    assert "fix it there in a text editor" in message and "do-not-quote" not in message


@pytest.mark.parametrize("cut", ['{"cells": [],\n "metadata": {"a": "cut off here',
                                 '{"cells": [],\n "metadata": {"a": 1, \n'])
def test_a_notebook_cut_short_says_the_file_ends_early(tmp_path, cut):
    path = tmp_path / "cut.ipynb"
    path.write_text(cut)
    with pytest.raises(GraderError) as info:
        notebook.read(path)
    assert ("it is not JSON: the file ends early, at line " in str(info.value)
            and "hand in a complete copy" in str(info.value)), str(info.value)
    assert "fix it there" not in str(info.value) and "at at" not in str(info.value)


def test_an_empty_file_is_called_empty(tmp_path):
    (tmp_path / "empty.ipynb").write_text("\n")
    with pytest.raises(GraderError, match=r"not a readable Jupyter notebook \(the file is empty"):
        notebook.read(tmp_path / "empty.ipynb")
