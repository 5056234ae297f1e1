"""MkDocs hooks: the reference pages made from the code, so they cannot drift from it.

A page holding ``<!-- generated: cli -->`` gets every command's ``--help`` (from the click commands), one
holding ``<!-- generated: api -->`` one mkdocstrings block per name of ``streamwhiten.__all__``, one
holding ``<!-- generated: job-file -->`` the keys a job file's tables take (from ``streamwhiten.params``, their help from ``streamwhiten.cli._flags``, and
the job file's own keys). ``mkdocs.yml`` names this file under ``hooks``.
"""

from __future__ import annotations

import click

CLI_MARK = "<!-- generated: cli -->"
JOB_MARK = "<!-- generated: job-file -->"
API_MARK = "<!-- generated: api -->"

OWN_HELP = {  # the job file's own keys (the parameters' help comes from streamwhiten.cli._flags)
    "name": "the job's name (`{name}` in an output template)",
    "paths": "input specs or globs, relative to the job file",
    "dataset": "the dataset or column of every input that names none",
    "path": "the model file (`.npz`): the statistics; with `[publish]` also `M.vN.npz` and the manifest",
    "output": "output template: `{stem}` and `{name}` of each input, e.g. `out/{stem}.h5`",
}


def api_reference() -> str:
    """One mkdocstrings block per name of ``streamwhiten.__all__``, at the module that defines it."""
    from streamwhiten import _PUBLIC

    parts = []
    for name, (module, attribute) in _PUBLIC.items():
        target = module if attribute is None else f"{module}.{attribute}"
        parts.append(f"## `streamwhiten.{name}`\n\n::: {target}\n    options:\n      show_root_heading: false\n")
    return "\n".join(parts)


def cli_reference() -> str:
    """Each command's help, as ``streamwhiten COMMAND --help`` prints it."""
    from streamwhiten.cli.app import cli

    parts = []
    with click.Context(cli, info_name="streamwhiten", terminal_width=100) as group:
        parts.append("## streamwhiten\n\n```text\n" + cli.get_help(group) + "\n```\n")
        for name in sorted(cli.list_commands(group)):
            command = cli.get_command(group, name)
            with click.Context(command, info_name=f"streamwhiten {name}", parent=group, terminal_width=100) as ctx:
                parts.append(f"## {name}\n\n```text\n{command.get_help(ctx)}\n```\n")
    return "\n".join(parts)


def _allowed(item) -> str:
    text = item.text
    if item.none:
        text += " (or unset: automatic)"
    return text.replace("|", "\\|")


def job_file_reference() -> str:
    """The keys of every table of a ``job.toml``: its own keys, then the parameters it takes."""
    from streamwhiten import params
    from streamwhiten.cli._flags import HELP
    from streamwhiten.job.file import OWN_KEYS

    def kind(value) -> str:
        kinds = value if isinstance(value, tuple) else (value,)
        return " or ".join({"str": "string", "list": "list of strings", "dict": "table"}[k.__name__] for k in kinds)

    out = []
    for table, own in OWN_KEYS.items():
        title = "top level" if table == "" else f"[{table}]"
        rows = [
            f"| `{key}` | {kind(value)} | | {OWN_HELP.get(key, 'the table of that name')} |"
            for key, value in own.items()
        ]
        if table:
            for name in params.job_keys(table):
                item = params.PARAMS[name]
                former = f" (former name of `{item.alias_of}`)" if item.alias_of else ""
                default = "automatic" if item.default is None else f"`{item.default!r}`"
                rows.append(
                    f"| `{name}`{former} | {_allowed(item)} | {default} | {HELP.get(item.alias_of or name, '').replace('|', '/')} |"
                )
        out.append(f"### {title}\n\n| key | value | default | what |\n|---|---|---|---|\n" + "\n".join(rows) + "\n")
    out.append(
        "### [storage]\n\nKeyword arguments of the file system of remote inputs and outputs (as "
        "`--storage-option KEY=VALUE` gives them; see [stores](stores.md)).\n"
    )
    return "\n".join(out)


def on_page_markdown(markdown: str, page, config, files) -> str:
    if CLI_MARK in markdown:
        markdown = markdown.replace(CLI_MARK, cli_reference())
    if API_MARK in markdown:
        markdown = markdown.replace(API_MARK, api_reference())
    if JOB_MARK in markdown:
        markdown = markdown.replace(JOB_MARK, job_file_reference())
    return markdown
