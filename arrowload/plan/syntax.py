"""SQL syntax errors in words a SQL user knows.

sqlglot reports what its parser missed ("Required keyword: 'expression' missing for
<class 'sqlglot.expressions.core.And'>"); :func:`syntax_error` turns that into what is
wrong with the text ("incomplete expression: AND needs an operand on its right") and
where, as an :class:`~arrowload.errors.ExpressionError` with line, column and a caret.
No message names the parser, its classes or its keywords.
"""

from __future__ import annotations

import re

from ..errors import ExpressionError

# sqlglot expression classes -> the SQL a user wrote
_OPERATORS = {
    "And": "AND", "Or": "OR", "Xor": "XOR", "Not": "NOT", "EQ": "=", "NEQ": "<>", "GT": ">",
    "GTE": ">=", "LT": "<", "LTE": "<=", "NullSafeEQ": "IS NOT DISTINCT FROM",
    "NullSafeNEQ": "IS DISTINCT FROM", "Like": "LIKE", "ILike": "ILIKE", "Glob": "GLOB",
    "SimilarTo": "SIMILAR TO", "RegexpLike": "~", "Is": "IS", "In": "IN", "Between": "BETWEEN",
    "Add": "+", "Sub": "-", "Mul": "*", "Div": "/", "IntDiv": "//", "Mod": "%", "Pow": "**",
    "Neg": "-", "DPipe": "||", "BitwiseAnd": "&", "BitwiseOr": "|", "BitwiseXor": "xor",
    "BitwiseNot": "~", "BitwiseLeftShift": "<<", "BitwiseRightShift": ">>", "Cast": "CAST",
    "TryCast": "TRY_CAST", "Case": "CASE", "If": "CASE WHEN", "Escape": "ESCAPE",
    "Collate": "COLLATE", "Distinct": "DISTINCT", "Alias": "AS", "Abs": "@",
}
_REQUIRED = re.compile(r"Required keyword: '(\w+)' missing for <class '(?:[\w.]*\.)?(\w+)'>")
_CLASS = re.compile(r"<class '(?:[\w.]*\.)?(\w+)'>")
# words that start or join clauses: never a value
_KEYWORDS = {"SELECT", "FROM", "WHERE", "GROUP", "ORDER", "BY", "HAVING", "LIMIT", "OFFSET",
             "UNION", "JOIN", "ON", "AS", "AND", "OR", "NOT", "IS", "IN", "LIKE", "BETWEEN",
             "THEN", "ELSE", "END", "WHEN", "QUALIFY", "WINDOW", "WITH", "INTO", "USING"}


def syntax_error(error: dict, text: str, what: str) -> ExpressionError:
    """The ExpressionError for one of sqlglot's ``ParseError.errors`` entries."""
    desc = str(error.get("description") or "")
    highlight = str(error.get("highlight") or "")
    line, col = error.get("line"), error.get("col")
    start = _token_start(text, line, col, highlight)
    token = highlight.strip()
    shown = token.upper() if token.upper() in _KEYWORDS else token
    m = _REQUIRED.search(desc)
    if m:
        part, cls = m.groups()
        op = _OPERATORS.get(cls, cls.upper())
        if shown.upper() in _KEYWORDS and shown.upper() != op:
            message = (f"a keyword where a value is expected: {shown} after {op}; write a value "
                       f"or a column there (quote a string as '{token.lower()}', a column named "
                       f'like a keyword as "{token.lower()}")')
        elif cls == "Between" and part in ("low", "high"):
            message = "incomplete BETWEEN: write x BETWEEN low AND high"
        elif cls in ("Not", "Neg", "BitwiseNot", "Abs"):
            message = f"incomplete expression: {op} needs an operand"
        elif cls in ("Where", "Having", "Qualify"):  # clauses: the condition follows the keyword
            message = f"incomplete query: {op} needs a condition after it"
        elif part == "this":
            message = f"incomplete expression: {op} needs an operand on its left"
            start = _operator_start(text, op, start)
        elif part == "expression":
            message = f"incomplete expression: {op} needs an operand on its right"
        else:
            message = f"incomplete expression: {op} is missing a part"
    elif desc.startswith("Expecting )"):
        opened = _unclosed_paren(text)
        message = "unbalanced parentheses: '(' is never closed; add ')'"
        if opened is not None:
            start = opened
    elif desc.startswith(("Expected ]", "Expecting ]")):
        message = "unbalanced brackets: '[' is never closed; add ']'"
    elif desc.startswith(("Expected }", "Expecting }")):
        message = "unbalanced braces: '{' is never closed; add '}'"
    elif desc.startswith("Expected TYPE after CAST"):
        message = "CAST needs a type: CAST(x AS INTEGER), CAST(x AS VARCHAR), CAST(x AS FLOAT[4]) ..."
    elif "Unexpected token" in desc or "Invalid expression" in desc:
        if token == ")":
            message = "unbalanced parentheses: ')' closes nothing; remove it or add '('"
        elif token == ",":
            message = ("unexpected ',': a trailing comma, or a list outside parentheses "
                       "(write x IN (1, 2))")
        elif shown.upper() in _KEYWORDS:
            message = f"unexpected keyword {shown}: a value, column or operator is missing before it"
        elif token:
            message = (f"unexpected {token!r}: two values without an operator between them, or "
                       "an operator SQL does not have (combine conditions with AND / OR)")
        else:
            message = "unexpected end of the text: the expression is incomplete"
    else:
        message = _CLASS.sub(lambda k: _OPERATORS.get(k.group(1), k.group(1).upper()), desc)
        message = message.replace("Required keyword", "missing part") or "syntax error"
    where_line, where_col = _line_col(text, start) if start is not None else (line, col)
    return ExpressionError(f"cannot parse {what}: {message}", text=text, line=where_line, column=where_col)


def check_complete(tree, text: str, what: str) -> None:
    """Raise the syntax error of a node the parser left without a required operand (DuckDB's
    prefix ``@`` parses to an ABS without its argument)."""
    for node in tree.walk():
        messages = node.error_messages()
        if messages:
            m = _REQUIRED.search(messages[0])
            op = _OPERATORS.get(m.group(2), m.group(2).upper()) if m else None
            start = _operator_start(text, op, None) if op else None
            line, col = _line_col(text, start) if start is not None else (None, None)
            raise syntax_error({"description": messages[0], "line": line,
                                "col": None if col is None else col + len(op or "") - 1,
                                "highlight": op or ""}, text, what)


def token_error(text: str, what: str, line: int, col: int) -> ExpressionError:
    """An unterminated string, quoted name or comment (the tokenizer gives no position;
    ``line`` / ``col`` come from scanning the text)."""
    lines = text.splitlines() or [text]
    rest = lines[line - 1][col - 1:] if line - 1 < len(lines) else ""
    if rest.startswith("/*"):
        message = "unterminated comment: '/*' is never closed with '*/'"
    elif rest.startswith('"'):
        message = 'unterminated quoted name: the \'"\' is never closed'
    else:
        message = ("unterminated string: the quote is never closed (a quote inside a string is "
                   "written twice: 'it''s')")
    return ExpressionError(f"cannot parse {what}: {message}", text=text, line=line, column=col)


def _offsets(text: str) -> list[int]:
    starts, pos = [0], 0
    for piece in text.splitlines(keepends=True):
        pos += len(piece)
        starts.append(pos)
    return starts


def _token_start(text: str, line, col, highlight: str) -> int | None:
    """Offset of the highlighted token: sqlglot's (line, col) point at its last character."""
    if not isinstance(line, int) or not isinstance(col, int):
        return None
    starts = _offsets(text)
    if line - 1 >= len(starts):
        return None
    end = starts[line - 1] + col - 1
    token = highlight.strip()
    begin = end - len(token) + 1
    if token and text[begin:end + 1] == token:
        return begin
    found = text.rfind(token, 0, end + 1) if token else -1
    return found if found >= 0 else min(end, max(len(text) - 1, 0))


def _operator_start(text: str, op: str, fallback):
    """Where an operator missing its left operand stands: its first occurrence."""
    m = re.search(r"(?<![\w])" + re.escape(op) + (r"(?![\w])" if op[-1].isalnum() else ""), text,
                  re.IGNORECASE)
    return m.start() if m else fallback


def _unclosed_paren(text: str) -> int | None:
    """Offset of the first '(' left open, outside strings and quoted names."""
    stack: list[int] = []
    quote = None
    for i, ch in enumerate(text):
        if quote:
            if ch == quote:
                quote = None
            continue
        if ch in "'\"":
            quote = ch
        elif ch == "(":
            stack.append(i)
        elif ch == ")" and stack:
            stack.pop()
    return stack[-1] if stack else None


def _line_col(text: str, offset: int) -> tuple[int, int]:
    before = text[:offset]
    return before.count("\n") + 1, offset - (before.rfind("\n") + 1) + 1
