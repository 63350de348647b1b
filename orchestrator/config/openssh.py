"""How the OpenSSH client reads the arguments an Ansible inventory hands it.

Ansible splits `ansible_ssh_args`, `ansible_ssh_common_args` and `ansible_ssh_extra_args` with
shlex, each word stripped (ansible-core 2.19.0 lib/ansible/plugins/connection/__init__.py:122-129),
and puts them on ssh's command line in that order (plugins/connection/ssh.py:874-879, 930-934).
What ssh then makes of them is read here as the OpenSSH client 10.0p1 does (openssh-portable tag
V_10_0_P1, cited as `file:line`):

- `argv_options`: ssh's getopt (ssh.c:756-757): options may be bundled (`-qo KEY=VALUE`), an
  option's argument attached (`-oKEY=VALUE`) or the next word (`-o KEY=VALUE`); `-J HOST` is
  the ProxyJump option (ssh.c:908-918); `--` ends the options.
- `config_line`: each `-o` argument is one configuration line (ssh.c:1082-1088 hands it to
  process_config_line): trailing whitespace dropped (readconf.c:1166-1172); the keyword ends at
  whitespace, a `"` or one `=` with whitespace around it (misc.c:445-483, strdelim) and is matched
  in lower case (readconf.c:1177-1185); the rest, which must not be empty (readconf.c:1187-1193),
  is split into arguments with `"`/`'` quotes and backslash escapes, `#` ending it
  (readconf.c:1197, misc.c:2065-2131, argv_split). A line ssh refuses makes it exit (ssh.c:1086).
- Values of yes/no options are matched without case (readconf.c:1104-1117);
  StrictHostKeyChecking takes true/yes, false/no/off, ask and accept-new
  (readconf.c:1019-1027), NoHostAuthenticationForLocalhost true/yes or false/no
  (readconf.c:1004-1010, 1354-1356).
- The first value given for an option is the one used (readconf.c:1278, and for the known-hosts
  files 1459: a later line adds nothing); `UserKnownHostsFile none` (any case) means no file
  (ssh.c:1544-1552), and the files of one line are all read.
"""

from __future__ import annotations

#: ssh's options that take an argument (ssh.c:756-757: the letters followed by ':')
_WITH_ARGUMENT = frozenset("bceilmopBDEFIJLOPQRSWw")
_WHITESPACE = " \t\r\n"  # misc.c:440
#: readconf.c:1019-1027 -> what ssh does: "yes" (check), "ask", "accept-new" or "off"
STRICT_HOST_KEY_CHECKING = {"true": "yes", "false": "off", "yes": "yes", "no": "off",
                            "ask": "ask", "off": "off", "accept-new": "accept-new"}
FLAG = {"true": True, "false": False, "yes": True, "no": False}  # readconf.c:1004-1010


def argv_options(args: list[str]) -> list[str]:
    """The configuration lines in an ssh argument list: each `-o` argument, and `-J HOST` as
    `ProxyJump=HOST`, in the order given."""
    out: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if arg == "--":
            break
        if not arg.startswith("-") or arg == "-":
            continue  # the host: ssh reads the options after it too (ssh.c:1152-1155)
        for j, letter in enumerate(arg[1:], 1):
            if letter in _WITH_ARGUMENT:
                value = arg[j + 1:]
                if not value and i < len(args):
                    value = args[i]
                    i += 1
                if letter == "o":
                    out.append(value)
                elif letter == "J":
                    out.append(f"ProxyJump={value}")
                break
    return out


def config_line(line: str) -> tuple[str, list[str]] | None:
    """A configuration line as (lower-case keyword, arguments); None for a line ssh skips (empty
    or a comment). ValueError with ssh's reason for a line ssh refuses."""
    line = line.rstrip(_WHITESPACE + "\f")
    keyword, rest = _strdelim(line)
    if keyword == "" and rest is not None:  # readconf.c:1179-1181
        keyword, rest = _strdelim(rest)
    if keyword is None or not keyword or keyword[0] in "\n#":
        return None
    rest = (rest or "").lstrip(_WHITESPACE)
    if not rest:
        raise ValueError(f"no argument after keyword {keyword!r}")
    return keyword.lower(), _argv_split(rest)


def _strdelim(s: str) -> tuple[str | None, str | None]:
    """misc.c:445-483 with split_equals: the first word and what follows it (None: the end)."""
    at = next((i for i, c in enumerate(s) if c in _WHITESPACE + '"='), None)
    if at is None:
        return s, None
    if s[at] == '"':  # misc.c:460-470: the quote is removed, the word runs to the next one
        close = s.find('"', at + 1)
        if close < 0:
            return None, None
        return s[:at] + s[at + 1:close], s[close + 1:].lstrip(_WHITESPACE)
    rest = s[at + 1:].lstrip(_WHITESPACE)
    if s[at] != "=" and rest.startswith("="):  # misc.c:472-480: one '=' may be skipped
        rest = rest[1:].lstrip(_WHITESPACE)
    return s[:at], rest


def _argv_split(s: str) -> list[str]:
    """misc.c:2065-2131 with terminate_on_comment."""
    out: list[str] = []
    i, n = 0, len(s)
    while i < n:
        if s[i] in " \t":
            i += 1
            continue
        if s[i] == "#":
            break
        quote, word = "", []
        while i < n:
            c = s[i]
            if c == "\\" and i + 1 < n and (s[i + 1] in "'\"\\" or (not quote and s[i + 1] == " ")):
                i += 1
                word.append(s[i])
            elif not quote and c in " \t":
                break
            elif not quote and c in "\"'":
                quote = c
            elif quote and c == quote:
                quote = ""
            else:
                word.append(c)
            i += 1
        if i >= n and quote:
            raise ValueError("invalid quotes")
        out.append("".join(word))
    return out
