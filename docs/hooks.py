"""MkDocs hooks and a Griffe extension (mkdocs.yml): the site from the pages as they are.

README.md is the landing page on GitHub and on the package index, so it links to
everything with absolute repository URLs (tests/test_distribution.py checks it);
the docs pages link to each other relatively, and to files outside docs/
(``../README.md``, ``../example_project/``) relatively too, which works on GitHub.
In the site, a link to a page the site has (README.md, a docs page) leads to that
page, and a link to any other repository file leads to the file on GitHub. The
rewritten links are then checked like any other (``mkdocs build --strict``).

The docstrings are written for Sphinx: :class:`SphinxMarkup` turns their roles
(``:class:`~a.B```) into code spans and their ``::`` literal-block markers into
the indented code blocks Markdown already sees, so the API reference shows them
as a reader of the source would.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any

import griffe
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

REPOSITORY = "https://github.com/django-rlock/django-rlock"
ROOT = Path(__file__).resolve().parent.parent
HOME = "index.md"

#: A Markdown link's target: ``](target)`` or ``](target "title")``.
_LINK = re.compile(r"\]\((?P<target>[^)\s]+)(?P<title>\s+\"[^\"]*\")?\)")
_ON_GITHUB = re.compile(
    rf"{re.escape(REPOSITORY)}(?:/(?:blob|tree)/main/(?P<path>[^#]*))?/?(?P<anchor>#.*)?\Z"
)

#: A Sphinx role: ``:class:`~a.B```, ``:meth:`title <a.B.c>```, ``:py:func:`a.f```.
_ROLE = re.compile(r":(?:py:)?[a-z]+:`(?P<tilde>~?)(?P<text>[^`<]*?)\s*(?:<(?P<target>[^`>]+)>)?`")
#: reST's mark of a literal block, in its three forms: ``::`` alone on its line
#: (it goes), ``text ::`` (it goes) and ``text::`` (it reads ``text:``).
_LITERAL_MARKS = (
    (re.compile(r"(?m)^[ \t]*::[ \t]*$"), ""),
    (re.compile(r"(?m)(?<=\S)[ \t]+::[ \t]*$"), ""),
    (re.compile(r"(?m)(?<=\S)::[ \t]*$"), ":"),
)


def _role(role: re.Match[str]) -> str:
    """A role as Sphinx shows it: its title, or its target (``~``: the last name only)."""
    text = role["text"]
    if role["tilde"]:
        text = text.rpartition(".")[2]
    return f"`{text}`"


class SphinxMarkup(griffe.Extension):
    """The docstrings' Sphinx roles and ``::`` marks, as Markdown."""

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        """Rewrite a member's docstring (every docstring is found by now, ``#:`` ones too)."""
        _rewrite(obj)

    def on_class_members(self, *, cls: griffe.Class, **kwargs: Any) -> None:
        """Leave out a class's special methods (``__enter__``, ``__reduce__``...).

        What ``with`` or pickling does is said in the class's docstring, and
        ``__init__``'s parameters are the class's own (merge_init_into_class). A
        ``public`` flag would not do: the reference reaches most classes through
        an alias (a package's re-export), whose members are aliases without it.
        """
        for name in [name for name in cls.members if _is_special(name) and name != "__init__"]:
            del cls.members[name]

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        """Rewrite a package's own docstring (``on_object`` sees its members only)."""
        _rewrite(pkg)


def _is_special(name: str) -> bool:
    return len(name) > 4 and name.startswith("__") and name.endswith("__")


def _rewrite(obj: griffe.Object) -> None:
    if obj.docstring is not None:
        value = _ROLE.sub(_role, obj.docstring.value)
        for mark, replacement in _LITERAL_MARKS:
            value = mark.sub(replacement, value)
        obj.docstring.value = value


def on_files(files: Files, config: Any) -> Files:
    """README.md, from the repository's root, as the site's ``index.md``."""
    files.append(File.generated(config, HOME, abs_src_path=str(ROOT / "README.md")))
    return files


def on_page_markdown(markdown: str, page: Page, config: Any, files: Files) -> str:
    """The page's links to repository files: to the site's page of it, else to GitHub.

    The home page is also put in a reader's order (:func:`home_page`).
    """
    if page.file.src_uri == HOME:
        markdown = home_page(markdown)
    docs = Path(config["docs_dir"]).resolve().relative_to(ROOT).as_posix()
    here = posixpath.dirname(page.file.src_uri)

    def rewrite(link: re.Match[str]) -> str:
        path, anchor = _repository_file(link["target"], docs, here)
        if path is None:
            return link[0]  # elsewhere on the web, or a docs file: mkdocs checks it
        site = HOME if path == "README.md" else _site_page(path, docs, files)
        if site is None and _ON_GITHUB.match(link["target"]):
            return link[0]
        if site is None:
            kind = "tree" if (ROOT / path).is_dir() else "blob"
            target = f"{REPOSITORY}/{kind}/main/{path}{anchor}"
        elif site == page.file.src_uri and anchor:
            target = anchor
        else:
            target = posixpath.relpath(site, here or ".") + anchor
        return f"]({target}{link['title'] or ''})"

    return _LINK.sub(rewrite, markdown)


#: A table of a page (Markdown's tables carry no class; mkdocstrings' do).
_TABLE = re.compile(r"<table>.*?</table>", re.S)
#: A code span, its text already escaped as HTML.
_CODE = re.compile(r"<code>(?P<text>[^<]*)</code>")
#: Where a name in a table may wrap: after a dot, an underscore, a slash or a bracket.
_NAME_JOINT = re.compile(r"(?<=[._/\[])(?=\w)")


def on_page_content(html: str, page: Page, config: Any, files: Files) -> str:
    """Names in tables wrap only between their words (``RLOCK_`` / ``WATCHDOG_`` / ``TIMEOUT``).

    Material lets code break anywhere, which split names mid-word in the
    settings table; docs/stylesheets/extra.css forbids that, and these
    ``<wbr>`` give the names the places where a narrow column may wrap them.
    """

    def joints(code: re.Match[str]) -> str:
        return "<code>" + _NAME_JOINT.sub("<wbr>", code["text"]) + "</code>"

    return _TABLE.sub(lambda table: _CODE.sub(joints, table[0]), html)


def home_page(readme: str) -> str:
    """README.md in the order a reader of the site needs: what it is, how to install it.

    The README opens with the two commands (``make demo``, ``make test``): a
    clone's first step. The site's reader has no clone yet: its home page opens
    with what the library is, then Install, then the commands under a heading
    of their own ("Try it"), these shell blocks wrapped rather than scrolled sideways
    (``rlock-wrap``, docs/stylesheets/extra.css), then the rest as the README has
    it. A README whose shape this does not recognize fails the build.
    """
    title, _, body = readme.partition("\n")
    about = body.find("\n**")  # the paragraph in bold: what the library is
    first_section = body.find("\n## ")
    install = body.find("\n## Install\n")
    after_install = body.find("\n## ", install + 1)
    if not (title.startswith("# ") and 0 <= about < first_section <= install < after_install):
        raise ValueError(
            "README.md no longer opens with the commands, then a bold paragraph, "
            "then sections with '## Install': update docs/hooks.py's home_page"
        )
    commands = _wrapped(body[:about].strip("\n"))
    return (
        "\n\n".join(
            [
                title,
                body[about:first_section].strip("\n"),
                _wrapped(body[install:after_install].strip("\n")),
                "## Try it\n\n" + commands,
                body[first_section:install].strip("\n"),
                body[after_install:].strip("\n"),
            ]
        )
        + "\n"
    )


def _wrapped(markdown: str) -> str:
    """``markdown`` with its shell blocks marked to wrap their long lines (``rlock-wrap``)."""
    return markdown.replace("```sh\n", "``` { .sh .rlock-wrap }\n")


def _repository_file(target: str, docs: str, here: str) -> tuple[str | None, str]:
    """The repository file outside ``docs`` that a link leads to, and its ``#anchor``."""
    on_github = _ON_GITHUB.match(target)
    if on_github:
        return on_github["path"] or "README.md", on_github["anchor"] or ""
    if "://" in target or target.startswith(("#", "mailto:")):
        return None, ""
    relative, hash_, fragment = target.partition("#")
    path = posixpath.normpath(posixpath.join(docs, here, relative))
    if path.startswith((f"{docs}/", "../")):
        return None, ""
    return path, hash_ + fragment


def _site_page(path: str, docs: str, files: Files) -> str | None:
    """The site's file of the repository file ``path`` (one under ``docs``), if any."""
    prefix = f"{docs}/"
    if path.startswith(prefix) and files.get_file_from_path(path.removeprefix(prefix)):
        return path.removeprefix(prefix)
    return None
