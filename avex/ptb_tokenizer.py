"""pycocoevalcap's PTB tokenisation in pure Python: :func:`tokenize` (one caption) and
:func:`tokenize_all` (one ``PTBTokenizer`` call over many captions).

pycocoevalcap pipes every caption through Stanford CoreNLP 3.4.1's PTBTokenizer (Java,
``-preserveLines -lowerCase``) and then drops the tokens in its PUNCTUATIONS list. Starting a
JVM per reward call is out of the question, so this is a re-implementation of the lexer rules
that ordinary captions meet: longest match wins, ties go to the earlier rule, as in JFlex.
Rule names follow the lexer's macros so the two can be read side by side.

The Java lexer reads all captions of a call as one text, one per line, and a few rules look
past the line end ("plan B." loses its period when the next caption starts with "The"):
tokenize_all reproduces a whole call, tokenize reads one caption as if a neutral one followed.
Lexer classes that captions do not meet (SGML beyond simple tags, e-mail and URL corner cases,
CP1252 control characters, emoji sequences) are approximated, not reproduced.
"""
from __future__ import annotations

import re

from avex import _checks

__all__ = ["tokenize", "tokenize_all"]

_PUNCTUATION = frozenset(["''", "'", "``", "`", ".", "?", "!", ",", ":", "-", "--", "...", ";"])
# (pycocoevalcap's list also has -LRB- -RRB- -LCB- -RCB-, but it compares them with the
# lower-cased output, where they read -lrb- ...; so brackets survive as -lrb- etc. Kept that way.)

# Python's [^\W\d_] also takes numeric symbols (fractions, superscripts, circled digits) that
# Java's isLetter does not: those are excluded by hand
_NUMERIC_SYMBOLS = ("\u00B2\u00B3\u00B9\u00BC-\u00BE\u2070-\u209F\u2150-\u218F\u2460-\u24FF"
                    "\u2776-\u2793")
_LET = rf"(?:[^\W\d_{_NUMERIC_SYMBOLS}]|[\u00AD\u0300-\u036F])"   # soft hyphen, accents too
_ALNUM = rf"(?:[^\W_{_NUMERIC_SYMBOLS}]|[\u00AD\u0300-\u036F])"
_SP = r"[ \t\u00A0\u2000-\u200A\u3000]"
_SPNL = r"[ \t\u00A0\u2000-\u200A\u3000\n]"
_APOS = r"(?:['\u0092\u2019]|&apos;)"
_APOSETC = r"(?:['\u0092\u2019\u0091\u2018\u201B]|&apos;)"
_WORD = rf"{_LET}(?:{_LET}|\d)*(?:[.!?]{_LET}(?:{_LET}|\d)*)*"
_REDAUX = rf"{_APOS}(?i:[msd]|re|ve|ll)"
_SWORD = rf"(?:[^\W\d_{_NUMERIC_SYMBOLS}]|\u00AD)*[A-MO-Za-mo-z]\u00AD*"
_SREDAUX = rf"(?i:n){_APOSETC}(?i:t)"
_NUM = r"(?:\d*(?:[.:,\u00AD\u066B\u066C]\d+)+|\d+)"
_ACRO = (r"(?:[A-Za-z](?:\.[A-Za-z])+"
         r"|(?i:(?:canada|sino|korean|eu|japan|non)-U\.S|U\.S\.-(?:U\.K|U\.S\.S\.R)))")
_HYPHEN = r"[-_\u058A\u2010\u2011]"
_THING_PART = rf"(?:[dDoOlL]{_APOSETC}{_ALNUM})?{_ALNUM}+"

# abbreviations whose final period stays on the token (caseless unless a letter is in [])
_ABMONTH = "Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec"
_ABDAYS = "Mon|Tue|Tues|Wed|Thu|Thurs|Fri"
_ABSTATE = ("Ala|Ariz|[A]z|[A]rk|Calif|Colo|Conn|Ct|Dak|[D]el|Fla|Ga|[I]ll|Ind|Kans?|Ky|[L]a|"
            "[M]ass|Md|Mich|Minn|[M]iss|Mo|Mont|Neb|Nev|Okla|[O]re|[P]a|Penn|Tenn|[T]ex|Va|Vt|"
            "[W]ash|Wisc?|Wyo")
_ABCOMP = "Inc|Cos?|Corp|Pp?t[ye]s?|Ltd|Plc|Rt|Bancorp|Dept|Bhd|Assn|Univ|Intl|Sys"
_ABNUM = "Ph|tel|est|ext|sq|ft"
_ABPTIT = r"Jr|Sr|Bros|(?:Ed|Ph)\.D|Blvd|Rd|Esq"
_ABTITLE = ("Mr|Mrs|Ms|[M]iss|Drs?|Profs?|Sens?|Reps?|Attys?|Lt|Col|Gen|Messrs|Govs?|Adm|Rev|"
            "Maj|Sgt|Cpl|Pvt|Mt|Capt|Ste?|Ave|Pres|Lieut|Hon|Brig|Co?mdr|Pfc|Spc|Supts?|Det|"
            "Adj|Adv|Asst|Assoc|Ens|Insp|Mlle|Mme|Msgr|Sfc")
_ABCOMP2 = "Invt|Elec|Natl|M[ft]g"


def _caseless(alternatives: str) -> str:
    """JFlex %caseless: literal letters match either case, letters inside [] do not."""
    out, i = [], 0
    while i < len(alternatives):
        ch = alternatives[i]
        if ch == "[":
            j = alternatives.index("]", i)
            inner = alternatives[i + 1:j]
            out.append(f"[{inner}]" if len(inner) > 1 or not inner.isalpha() else inner)
            i = j + 1
        else:
            out.append(f"[{ch.lower()}{ch.upper()}]" if ch.isalpha() else ch)
            i += 1
    return "(?:" + "".join(out) + ")"


# (Python takes the first alternative that fits, JFlex the longest: long ones go first)
_ABBREV1 = (_caseless("|".join([_ABPTIT, _ABMONTH, _ABDAYS, _ABSTATE, _ABCOMP, _ABNUM,
                                "etc|al|seq|bldg"])) + r"\.")
_ABOTHER = _caseless(r"vs|Alex|Wm|Jos|Cie|a\.k\.a|cf|TREAS")
_ABBREV4 = (rf"(?:{_ACRO}|{_caseless(_ABTITLE)}|{_ABOTHER}|{_caseless(_ABCOMP2)}|[A-Za-z])")
_ABBREV3 = _caseless("ca|figs?|prop|nos?|art|pp|op") + r"\."     # kept only before a number
# words after which an acronym's period also ends the sentence (first letter case-sensitive)
_SENTENCE_STARTERS = _caseless(
    r"[A]bout|[A]ccording|[A]dditionally|[A]fter|[A]n|[A]|[A]s|[A]t|[B]ut|[D]id|[D]uring|"
    r"[E]arlier|[H]e|[H]er|[H]ere|[H]ow|[H]owever|[I]f|[I]n|[I]t|[L]ast|[M]any|[M]ore|"
    r"[M]r\.|[M]s\.|[N]ow|[O]nce|[O]ne|[O]ther|[O]ur|[S]he|[S]ince|[S]o|[S]ome|[S]uch|"
    r"[T]hat|[T]he|[T]heir|"
    "[T]hen|[T]here|[T]hese|[T]hey|[T]his|[W]e|[W]hen|[W]hile|[W]hat|[W]ho|[W]hy|[Y]et|[Y]ou")

_QUOTE_TO_LATEX = str.maketrans({"\u0091": "`", "\u2018": "`", "\u201B": "`", "\u2039": "`",
                                 "\u0092": "'", "\u2019": "'", "\u203A": "'",
                                 "\u0093": "``", "\u201C": "``", "\u00AB": "``",
                                 "\u0094": "''", "\u201D": "''", "\u00BB": "''"})
_FRACTIONS = str.maketrans({"\u00BC": "1/4", "\u00BD": "1/2", "\u00BE": "3/4",
                            "\u2153": "1/3", "\u2154": "2/3"})
_CURRENCY = str.maketrans({"\u00A2": "cents", "\u00A3": "#", "\u0080": "$", "\u00A4": "$",
                           "\u20A0": "$", "\u20AC": "$"})
_BRACKETS = {"(": "-LRB-", ")": "-RRB-", "[": "-LSB-", "]": "-RSB-", "{": "-LCB-", "}": "-RCB-"}


def _latex_quotes(tok: str, probably_left: bool) -> str:
    tok = tok.replace("&apos;", "'").replace("&quot;", '"')
    tok = tok.replace("'", "`" if probably_left else "'")
    tok = tok.replace('"', "``" if probably_left else "''")
    return tok.translate(_QUOTE_TO_LATEX)


def _parens(tok: str) -> str:
    return tok.replace("(", "-LRB-").replace(")", "-RRB-")


def _same(tok: str) -> str:
    return tok


def _no_soft_hyphen(tok: str) -> str:
    return tok.replace("\u00AD", "")


# (name, pattern, action). A pattern may end in a group named "ctx": JFlex trailing context,
# which counts towards the match length but is not consumed. An action maps the consumed text to
# the token, or is an int: keep that many characters and lex the rest again (JFlex yypushback).
_RULES = [
    ("ASSIMILATIONS3", r"(?i:cannot|'twas)", -3),
    ("ASSIMILATIONS2", r"(?i:'tis|gonna|gotta|lemme|gimme|wanna)", -2),
    ("SGML", r"<\/?[A-Za-z!][^>\r\n]*>", lambda t: t.replace(" ", "\u00A0")),
    ("SPMDASH", r"(?i:&(?:MD|mdash|ndash);)|[\u0096\u0097\u2013\u2014\u2015]", lambda t: "--"),
    ("SPAMP", r"(?i:&amp;)", lambda t: "&"),
    ("WORD/REDAUX", rf"{_WORD}(?P<ctx>{_REDAUX})", _no_soft_hyphen),
    ("SWORD/SREDAUX", rf"{_SWORD}(?P<ctx>{_SREDAUX})", _no_soft_hyphen),
    ("WORD", _WORD, _no_soft_hyphen),
    ("APOWORD", rf"{_APOS}(?i:n){_APOS}?|[lLdDjJ]{_APOS}|(?i:dunkin|somethin|ol){_APOS}|"
                rf"{_APOS}(?i:em)|[A-HJ-XZn]{_APOSETC}{_LET}{{2,}}|{_APOS}[2-9]0(?i:s)|"
                rf"{_APOS}(?i:till?)|{_LET}+[aeiouyAEIOUY]{_APOSETC}[aeiouA-Z]{_LET}*|"
                rf"{_APOS}(?i:cause)|(?i:cont'd\.?|nor'easter|c'mon|e'er|s'mores|ev'ry|li'l|nat'l)",
     _same),
    ("APOWORD2", rf"(?i:y){_APOS}(?P<ctx>{_LET})", _same),
    ("FULLURL", r"(?i:https?):\/\/[^ \t\n\f\r\"<>|()]+[^ \t\n\f\r\"<>|.!?(){},-]", _same),
    ("LIKELYURL", r"(?:(?:(?i:www)\.(?:[^ \t\n\f\r\"<>|.!?(){},]+\.)+[a-zA-Z]{2,4})|"
                  r"(?:(?:[^ \t\n\f\r\"`'<>|.!?(){},-_$]+\.)+(?i:com|net|org|edu)))"
                  r"(?:\/[^ \t\n\f\r\"<>|()]+[^ \t\n\f\r\"<>|.!?(){},-])?", _same),
    ("EMAIL", r"[a-zA-Z0-9][^ \t\n\f\r\"<>|()\u00A0]*@(?:[^ \t\n\f\r\"<>|(){}.\u00A0]+\.)*"
              r"[^ \t\n\f\r\"<>|(){}\[\].,;:\u00A0]+", _same),
    ("TWITTER", rf"[@\uFF20][A-Za-z_][A-Za-z_0-9]*|[#\uFF03]{_LET}(?:{_LET}|\d|_)*", _same),
    ("REDAUX/NONALPHA", rf"{_REDAUX}(?P<ctx>[^\w\u00AD]|[\d_])", lambda t: _latex_quotes(t, False)),
    ("SREDAUX/NONALPHA", rf"{_SREDAUX}(?P<ctx>[^\w\u00AD]|[\d_])",
     lambda t: _latex_quotes(t, False)),
    ("DATE", r"\d{1,2}[\-\/]\d{1,2}[\-\/]\d{2,4}", _same),
    ("NUMBER", rf"[\-+]?{_NUM}", lambda t: t.replace("\u00AD", "")),
    ("SUBSUPNUM", r"[\u207A\u207B\u208A\u208B]?(?:[\u2070\u00B9\u00B2\u00B3\u2074-\u2079]+|"
                  r"[\u2080-\u2089]+)", _same),
    ("FRAC", r"(?:\d{1,4}[- \u00A0])?\d{1,4}(?:\\?\/|\u2044)\d{1,4}",
     lambda t: t.replace(" ", "\u00A0")),
    ("FRAC2", r"[\u00BC\u00BD\u00BE\u2153-\u215E]", lambda t: t.translate(_FRACTIONS)),
    ("TBSPEC", rf"-(?i:RRB|LRB|RCB|LCB|RSB|LSB)-|(?i:C\.D\.s|pro-|anti-|S(?:&|&amp;)P-500|"
               rf"S(?:&|&amp;)Ls)|(?i:Cap){_APOS}(?i:n)|(?i:c){_APOS}(?i:est)", _same),
    ("THING3", rf"{_ALNUM}+(?:-{_LET}+){{0,2}}(?:\\?\/{_ALNUM}+(?:-{_LET}+){{0,2}}){{1,2}}", _same),
    ("DOLSIGN", r"[A-Z]*\$|#", _same),
    ("DOLSIGN2", r"[\u00A2\u00A3\u00A4\u00A5\u0080\u20A0\u20AC\u060B\u0E3F\u20A4\uFFE0\uFFE1"
                 r"\uFFE5\uFFE6]", lambda t: t.translate(_CURRENCY)),
    # an acronym before a sentence starter also ends the sentence; "I." gives "I" and "."
    ("ACRONYM/STARTER", rf"(?:{_ACRO}|[A-Za-z])\.(?P<ctx>{_SPNL}+(?:{_SENTENCE_STARTERS})"
                        rf"(?:{_SPNL}|[?!]))", lambda t: t[:-1] if len(t) == 2 else t),
    ("ABBREV3/DIGIT", rf"{_ABBREV3}(?P<ctx>{_SP}?\d)", _same),
    ("ABBREV1", _ABBREV1, _same),
    ("ABBREV2", rf"{_ABBREV4}\.", _same),
    ("ACRO/SPACE", rf"{_ACRO}(?P<ctx>{_SPNL})", _same),
    ("TBSPEC2", rf"{_APOS}\d\d(?P<ctx>{_SPNL})", _same),
    ("WORD./INSENTP", rf"{_WORD}\.(?P<ctx>[,;:])", _no_soft_hyphen),
    ("PHONE", r"(?:\(\d{2,3}\)[ \u00A0]?|(?:\+\+?)?(?:\d{2,4}[\- \u00A0])?\d{2,4}[\- \u00A0])"
              r"\d{3,4}[\- \u00A0]?\d{3,5}|(?:(?:\+\+?)?\d{2,4}\.)?\d{2,4}\.\d{3,4}\.\d{3,5}",
     lambda t: _parens(t.replace(" ", "\u00A0"))),
    ("DBLQUOT/ALNUM", r"(?:\"|&quot;)(?P<ctx>[^\W_]|\$)", lambda t: _latex_quotes(t, True)),
    ("DBLQUOT", r"\"|&quot;", lambda t: _latex_quotes(t, False)),
    ("LESSTHAN", r"<|&lt;", lambda t: "<"),
    ("GREATERTHAN", r">|&gt;", lambda t: ">"),
    ("SMILEY", r"[<>]?[:;=][\-o\*']?[\(\)DPdpO\\{@\|\[\]](?P<ctx>[^\w]|_)", _parens),
    ("BRACKET", r"[(){}\[\]]", _BRACKETS.__getitem__),
    ("HYPHENS", r"-+", lambda t: "--" if 3 <= len(t) <= 4 else t),
    ("LDOTS", r"\.{3,5}|(?:\.[ \u00A0]){2,4}\.|[\u0085\u2026]", lambda t: "..."),
    ("FNMARKS", r"@+|#+|_+", _same),
    ("ASTS", r"\*+|(?:\\\*){1,3}", _same),
    ("INSENTP", r"[,;:]", _same),
    ("BANGS", r"[?!]+", _same),
    ("PERIOD", r"[.\u00A1\u00BF\u037E\u0589\u061F\u06D4\u0700-\u0702\u07FA\u3002]", _same),
    ("EQUALS", r"=+", _same),
    ("SLASH", r"\/", _same),
    ("HTHING", rf"[A-Za-z0-9][A-Za-z0-9.,\u00AD]*(?:-(?:[A-Za-z0-9\u00AD]+|{_ACRO}\.))+",
     _no_soft_hyphen),
    ("THING", rf"{_THING_PART}(?:{_HYPHEN}{_THING_PART})*", _same),
    ("THINGA", r"[A-Z]+(?:(?:[+&]|&amp;)[A-Z]+)+", lambda t: t.replace("&amp;", "&")),
    ("QUOTES/LETTER", r"(?:" + _APOS + r"|''|[`\u2018\u2019\u201A\u201B\u201C\u201D\u0091-\u0094"
                      r"\u201E\u201F\u2039\u203A\u00AB\u00BB]{1,2})(?P<ctx>" + _LET
                      + r"[^ \t\n\r\u00A0])",
     lambda t: _latex_quotes(t, True)),
    ("QUOTES", r"" + _APOS + r"|''|[`\u2018\u2019\u201A\u201B\u201C\u201D\u0091-\u0094\u201E"
               r"\u201F\u2039\u203A\u00AB\u00BB]{1,2}", lambda t: _latex_quotes(t, False)),
    ("REDAUX", _REDAUX, lambda t: _latex_quotes(t, False)),
    ("SREDAUX", _SREDAUX, lambda t: _latex_quotes(t, False)),
    ("FAKEDUCKFEET", r"<<|>>", _same),
    ("MISCSYMBOL", r"[+%&~\^|\\\u00A6\u00A7\u00A8\u00A9\u00AC\u00AE\u00AF\u00B0-\u00B3"
                   r"\u00B4-\u00BA\u00D7\u00F7\u0387\u05BE\u05C0\u05C3\u05C6\u05F3\u05F4"
                   r"\u0600-\u0603\u0606-\u060A\u060C\u0614\u061B\u061E\u066A\u066D\u0703-\u070D"
                   r"\u07F6-\u07F8\u0964\u0965\u0E4F\u1FBD\u2016\u2017\u2020-\u2023\u2030-\u2038"
                   r"\u203B\u203E-\u2042\u2044\u207A-\u207F\u208A-\u208E\u2100-\u214F"
                   r"\u2190-\u21FF\u2200-\u2BFF\u3012\u30FB\uFF01-\uFF0F\uFF1A-\uFF20"
                   r"\uFF3B-\uFF40\uFF5B-\uFF65]", _same),
]
_COMPILED = [(name, re.compile(pattern), action) for name, pattern, action in _RULES]
_SKIP = re.compile(r"(?:[\s\x00\u200B\u200E\u200F\uFEFF]|&nbsp;)+")
_PLAIN_CHUNK = re.compile(rf"[^\W\d_{_NUMERIC_SYMBOLS}]+")   # letters only: one WORD token
_WORD_THEN_MARK = re.compile(rf"([^\W\d_{_NUMERIC_SYMBOLS}]+)([.,;:!?])(?=\s|$)")
_ABBREVIATION = re.compile(rf"{_ABBREV1}|{_ABBREV4}\.|{_ABBREV3}")
_ASSIMILATED = re.compile(r"(?i:cannot|gonna|gotta|lemme|gimme|wanna)")
_ASSIMILATED_WORD = re.compile(r"(?i)\b(?:cannot|gonna|gotta|lemme|gimme|wanna)\b")
_SIMPLE_CAPTION = re.compile(
    rf"[ ]*(?:[^\W\d_{_NUMERIC_SYMBOLS}]+[,;:]?[ ]+)*[^\W\d_{_NUMERIC_SYMBOLS}]+([.!?]?)[ ]*")
_MARKS = re.compile(r"[,;:.!?]")
_LINE_BREAKS = re.compile(r"[\n\r\u2028\u2029\u000B\u000C\u0085]")


def _lex(text: str) -> list[list[str]]:
    """PTB tokens of each line of ``text`` (not yet lower-cased or filtered)."""
    lines: list[list[str]] = [[]]
    tokens = lines[0]
    pos, end = 0, len(text)
    while pos < end:
        skip = _SKIP.match(text, pos)
        if skip:
            for _ in range(text.count("\n", pos, skip.end())):
                tokens = []
                lines.append(tokens)
            pos = skip.end()
            continue
        # the common cases without trying every rule: a word alone, or a word and one mark
        plain = _PLAIN_CHUNK.match(text, pos)
        if plain and (plain.end() == end or text[plain.end()].isspace()) \
                and not _ASSIMILATED.fullmatch(plain.group()):
            tokens.append(plain.group())
            pos = plain.end()
            continue
        marked = _WORD_THEN_MARK.match(text, pos)
        if marked and not _ASSIMILATED.fullmatch(marked.group(1)) \
                and not (marked.group(2) == "." and _ABBREVIATION.fullmatch(marked.group())):
            tokens += marked.groups()
            pos = marked.end()
            continue
        best, best_len = None, 0
        for rule in _COMPILED:
            m = rule[1].match(text, pos)
            if m and m.end() - pos > best_len:
                best, best_len = (rule, m), m.end() - pos
        if best is None:
            pos += 1                           # untokenizable: PTBTokenizer deletes it
            continue
        (_, _, action), m = best
        stop = m.start("ctx") if "ctx" in m.re.groupindex else m.end()
        if isinstance(action, int):
            stop += action
            tokens.append(text[pos:stop])
        else:
            tokens.append(action(text[pos:stop]))
        pos = stop
    return lines


def _finish(tokens: list[str]) -> str:
    """Lower-case and drop pycocoevalcap's punctuation tokens."""
    words = (tok.lower() for tok in tokens)
    return " ".join(w for w in words if w not in _PUNCTUATION)


def _one_line(caption: str) -> str:
    # PTBTokenizer reads one caption per line, so a newline inside one is a space; other line
    # breaks (\r, U+2028, ...) would split pycocoevalcap's own lines: spaces here as well
    return _LINE_BREAKS.sub(" ", caption)


def _tokenize_caption(caption: str) -> str:
    simple = _SIMPLE_CAPTION.fullmatch(caption)
    if simple and not _ASSIMILATED_WORD.search(caption) and not (
            simple.group(1) == "." and _ABBREVIATION.fullmatch(caption.rsplit(None, 1)[-1])):
        # words, commas and a final mark only (most captions): the lexer would split off the
        # marks and keep each word whole, so skip it
        return " ".join(_MARKS.sub("", caption).lower().split())
    # the trailing newline stands for the end of the line that follows each caption in
    # PTBTokenizer's input (the last caption of a batch sees end of file instead)
    return _finish(_lex(_one_line(caption) + "\n")[0])


def tokenize(caption: str) -> str:
    """A caption as pycocoevalcap's ``PTBTokenizer`` returns it: lower-cased PTB tokens, joined
    by spaces, with its punctuation tokens removed. Pure Python, no JVM.

    The caption is read as PTBTokenizer reads any caption but the last of its batch: followed by
    a line break, and by a next caption that does not start a sentence. (The Java lexer looks
    across lines: "plan B." loses its period when the next caption starts with "The". Use
    :func:`tokenize_all` to reproduce one PTBTokenizer call exactly, quirks included.)

    >>> tokenize("A dog's bark, loud!")
    "a dog 's bark loud"
    """
    if not isinstance(caption, str):
        raise TypeError(f"caption must be a str, got {type(caption).__name__}: {caption!r}")
    return _tokenize_caption(caption)


def tokenize_all(captions) -> list[str]:
    """Tokenise ``captions`` exactly as one pycocoevalcap ``PTBTokenizer`` call over them, in
    order: one text, one caption per line, so the lexer's look-ahead crosses from a caption into
    the next, and the last caption ends at end of file."""
    captions = _checks.str_list("captions", captions)
    if not captions:
        return []
    lines = _lex("\n".join(map(_one_line, captions)))
    return [_finish(tokens) for tokens in lines]
