#!/usr/bin/env python3
"""The longest functions of a Rust tree (usage: ci/longest-functions.py DIR [N]):
lines from the `fn` line to its closing brace, comments and blank lines
included, by brace matching outside strings, chars and comments."""
import os, re, sys
root = sys.argv[1]; top = int(sys.argv[2]) if len(sys.argv) > 2 else 10
fn_re = re.compile(r'^\s*(pub(\([^)]*\))?\s+)?(const\s+)?(async\s+)?(unsafe\s+)?(extern\s+"C"\s+)?fn\s+(\w+)')
def strip(line, state):
    # remove strings/chars/comments; state carries block-comment depth and raw-string
    out = []; i = 0; n = len(line)
    while i < n:
        if state['block']:
            j = line.find('*/', i)
            if j < 0: return ''.join(out)
            state['block'] = False; i = j + 2; continue
        if state['str']:
            if line[i] == '\\': i += 2; continue
            if line[i] == '"': state['str'] = False
            i += 1; continue
        if state['raw'] is not None:
            end = '"' + '#' * state['raw']
            j = line.find(end, i)
            if j < 0: return ''.join(out)
            state['raw'] = None; i = j + len(end); continue
        c = line[i]
        if line.startswith('//', i): break
        if line.startswith('/*', i): state['block'] = True; i += 2; continue
        m = re.match(r'r(#*)"', line[i:])
        if m and (i == 0 or not (line[i-1].isalnum() or line[i-1] == '_')):
            state['raw'] = len(m.group(1)); i += len(m.group(0)); continue
        if c == '"': state['str'] = True; i += 1; continue
        if c == "'":
            m = re.match(r"'(\\.|\\u\{[0-9a-fA-F]+\}|[^\\'])'", line[i:])
            if m: i += len(m.group(0)); continue
        out.append(c); i += 1
    return ''.join(out)
res = []
for d, dirs, files in os.walk(root):
    dirs[:] = [x for x in dirs if x not in ('target', '.git', 'fixtures')]
    for f in files:
        if not f.endswith('.rs'): continue
        p = os.path.join(d, f)
        lines = open(p, errors='replace').read().split('\n')
        state = {'block': False, 'str': False, 'raw': None}
        stack = []  # (name, start, depth at open)
        depth = 0; pending = None
        for no, line in enumerate(lines, 1):
            m = fn_re.match(line) if not (state['block'] or state['str'] or state['raw'] is not None) else None
            code = strip(line, state)
            if m: pending = (m.group(7), no)
            for ch in code:
                if ch == '{':
                    depth += 1
                    if pending: stack.append((pending[0], pending[1], depth)); pending = None
                elif ch == '}':
                    if stack and stack[-1][2] == depth:
                        name, start, _ = stack.pop()
                        res.append((no - start + 1, p, start, name))
                    depth -= 1
                elif ch == ';' and pending and not stack or (ch == ';' and pending and stack and depth == stack[-1][2]):
                    pending = None  # declaration without body
res.sort(reverse=True)
for n, p, s, name in res[:top]:
    print(f'{n:5} {p}:{s} {name}')
