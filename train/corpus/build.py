#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Rebuild the demo model's prose corpus from Debian main packages (issue 15).

    build.py [--packages packages.txt] [--max-packages N] [--data train/data] [--jobs N]

For each package of the list: `apt-get download` (no install) into DATA/debs, `dpkg-deb -x` into
DATA/root/PKG, then
  - every English manual page of sections 1, 5, 7 and 8 (manpages-dev: also 2 and 3) rendered to plain text (`man -l`, `col -bx`),
    the 7-column body indentation removed;
  - README/NEWS-like text files under usr/share/doc/PKG (plain or .gz, at most 200 KB each);
  - WordNet's glosses (wordnet-base: usr/share/wordnet/data.*) as "word (part of speech): gloss".
Writes DATA/corpus/{train,heldout}.jsonl (one document a line: {"src", "pkg", "text"}; a document is
held out when a hash of its name says so, 2%), DATA/corpus/manpages.jsonl (the structured pages chat
generation reads: name, summary, description, options) and DATA/manifest.tsv (package, version,
license from its copyright file, bytes). Nothing here is committed (.gitignore): this script is
the corpus's source.
"""
import argparse
import concurrent.futures as cf
import gzip
import hashlib
import json
import os
import re
import subprocess
import sys

HELDOUT_PERCENT = 2


def heldout(name):
    return int(hashlib.sha1(name.encode()).hexdigest()[:8], 16) % 100 < HELDOUT_PERCENT


def read_list(path):
    pkgs = []
    for line in open(path):
        line = line.split('#', 1)[0]
        pkgs += line.split()
    return list(dict.fromkeys(pkgs))


def download(pkgs, debs):
    os.makedirs(debs, exist_ok=True)
    have = {f.split('_', 1)[0] for f in os.listdir(debs) if f.endswith('.deb')}
    need = [p for p in pkgs if p not in have]
    # Debian main only: ask apt for the URIs first and keep the packages whose candidate comes
    # from a Debian archive's pool/main (a machine may have other sources configured); names apt
    # cannot resolve are dropped with a message and the question repeated
    uris = {}
    for _ in range(20):
        if not need:
            break
        r = subprocess.run(['apt-get', 'download', '--print-uris'] + need, cwd=debs, capture_output=True, text=True)
        if r.returncode == 0:
            for ln in r.stdout.splitlines():
                f = ln.split()
                if len(f) >= 2:
                    uris[f[1].split('_', 1)[0]] = f[0].strip("'")
            break
        bad = set(re.findall(r"(?:Unable to locate package |from package |of ')([^\s':]+)", r.stderr))
        bad = {b for b in bad if b in need}
        if not bad:
            print(r.stderr, file=sys.stderr)
            break
        for b in sorted(bad):
            print(f'  {b}: no downloadable Debian candidate, skipped', file=sys.stderr)
        need = [p for p in need if p not in bad]
    main = [p for p in need if re.search(r'/debian(-security)?/pool/(updates/)?main/', uris.get(p, ''))]
    for p in need:
        if p not in main:
            print(f'  {p}: candidate not from Debian main ({uris.get(p, "no URI")}), skipped', file=sys.stderr)
    if main:
        subprocess.run(['apt-get', 'download'] + main, cwd=debs, capture_output=True, check=True)
    out = {}
    for f in sorted(os.listdir(debs)):
        if f.endswith('.deb'):
            out[f.split('_', 1)[0]] = os.path.join(debs, f)
    return out


def deb_field(deb, field):
    return subprocess.run(['dpkg-deb', '-f', deb, field], capture_output=True, text=True).stdout.strip()


def license_of(root, pkg):
    """The licenses a DEP-5 copyright file names (short names, in order), or its first lines."""
    path = os.path.join(root, 'usr/share/doc', pkg, 'copyright')
    link = os.path.join(root, 'usr/share/doc', pkg)
    if not os.path.exists(path) and os.path.islink(link):
        # a doc folder linked to another package's (p7zip-full -> p7zip): that package's copyright,
        # from this deb or from the other's extracted tree
        target = os.path.basename(os.readlink(link))
        for cand in (os.path.join(root, 'usr/share/doc', target, 'copyright'),
                     os.path.join(os.path.dirname(root), target, 'usr/share/doc', target, 'copyright')):
            if os.path.exists(cand):
                path = cand
                break
        else:
            return f'see package {target} (its doc folder is a link there)'
    if not os.path.exists(path):
        return 'unknown (no copyright file)'
    text = open(path, errors='replace').read()
    names = re.findall(r'^License:\s*(\S.*)$', text, flags=re.M)
    if names:
        return '; '.join(dict.fromkeys(n.strip() for n in names))[:200]
    for kw in ('GPL', 'LGPL', 'BSD', 'MIT', 'Apache', 'Artistic', 'public domain', 'ISC'):
        if kw.lower() in text.lower():
            return f'{kw} (from copyright text)'
    return 'see copyright'


FOOTER = re.compile(r'^\S.*\s{3,}\S.*\s{3,}\S.*$')


def render_man(path):
    env = dict(os.environ, MANWIDTH='80', LC_ALL='C.UTF-8', MAN_KEEP_FORMATTING='0', MANPAGER='cat',
               PAGER='cat', MAN_DISABLE_SECCOMP='1')
    try:
        # no shell and stdin closed: a page that makes man wait, or a pipeline child that outlives a
        # timeout, cannot hold the build (seen: a shell pipeline left the reader waiting forever)
        m = subprocess.run(['man', '--nj', '--nh', '-l', path], stdin=subprocess.DEVNULL, capture_output=True,
                           env=env, timeout=30, start_new_session=True)
        r = subprocess.run(['col', '-bx'], input=m.stdout, capture_output=True, timeout=30)
    except subprocess.TimeoutExpired:
        return None
    text = r.stdout.decode('utf-8', 'replace')
    lines = text.split('\n')
    # drop the header and footer lines (NAME(1)   title   NAME(1))
    while lines and not lines[0].strip():
        lines.pop(0)
    if lines and FOOTER.match(lines[0]):
        lines.pop(0)
    while lines and not lines[-1].strip():
        lines.pop()
    if lines and FOOTER.match(lines[-1]):
        lines.pop()
    out = []
    for ln in lines:
        ln = ln.rstrip()
        if ln.startswith('       '):
            ln = ln[7:]
        out.append(ln)
    text = re.sub(r'\n{3,}', '\n\n', '\n'.join(out)).strip()
    return text if len(text) > 200 else None


SECTION = re.compile(r'^([A-Z][A-Z /-]+)$')


def man_structure(name, text):
    """name, summary (the NAME line's text after the dash), description (first paragraph) and
    options [(flags, help)] from a rendered page."""
    secs, cur = {}, None
    for ln in text.split('\n'):
        m = SECTION.match(ln)
        if m:
            cur = m.group(1).strip()
            secs[cur] = []
        elif cur:
            secs[cur].append(ln)
    summary = ''
    if 'NAME' in secs:
        nm = ' '.join(x.strip() for x in secs['NAME'] if x.strip())
        if ' - ' in nm:
            summary = nm.split(' - ', 1)[1].strip()
        elif ' \u2014 ' in nm:
            summary = nm.split(' \u2014 ', 1)[1].strip()
    desc = ''
    if 'DESCRIPTION' in secs:
        paras = '\n'.join(secs['DESCRIPTION']).strip().split('\n\n')
        if paras:
            desc = ' '.join(x.strip() for x in paras[0].split('\n'))
    opts = []
    for sec in ('OPTIONS', 'DESCRIPTION'):
        body = secs.get(sec, [])
        i = 0
        while i < len(body):
            ln = body[i]
            m = re.match(r'^(-{1,2}[A-Za-z0-9][^\s,]*(?:,? ?-{1,2}[A-Za-z0-9][^\s,]*)*)(?:[ =]\S+)?\s*$', ln)
            if m and i + 1 < len(body) and body[i + 1].startswith('    '):
                helpl = []
                j = i + 1
                while j < len(body) and body[j].startswith('    '):
                    helpl.append(body[j].strip())
                    j += 1
                h = ' '.join(helpl)
                if 10 < len(h) < 400:
                    opts.append((ln.strip(), h))
                i = j
            else:
                i += 1
        if opts:
            break
    return dict(name=name, summary=summary, description=desc[:800], options=opts[:40])


def docs_of(root, pkg):
    d = os.path.join(root, 'usr/share/doc', pkg)
    out = []
    if not os.path.isdir(d):
        return out
    for dirpath, _, files in os.walk(d):
        for f in sorted(files):
            base = f[:-3] if f.endswith('.gz') else f
            if not re.match(r'^(README|NEWS|FAQ|TODO|USAGE|HOWTO|INSTALL)([._-].*)?$|.*\.txt$', base, re.I):
                continue
            p = os.path.join(dirpath, f)
            if os.path.islink(p):
                continue
            try:
                raw = gzip.open(p).read() if f.endswith('.gz') else open(p, 'rb').read()
            except OSError:
                continue
            if len(raw) > 200_000 or b'\0' in raw[:4096]:
                continue
            text = raw.decode('utf-8', 'replace').strip()
            if len(text) > 300:
                out.append((os.path.relpath(p, root), text))
    return out


POS = {'n': 'noun', 'v': 'verb', 'a': 'adjective', 's': 'adjective', 'r': 'adverb'}


def wordnet(root):
    out = []
    for kind in ('noun', 'verb', 'adj', 'adv'):
        p = os.path.join(root, 'usr/share/wordnet', f'data.{kind}')
        if not os.path.exists(p):
            continue
        for ln in open(p, errors='replace'):
            if ln.startswith('  ') or '|' not in ln:
                continue
            head, gloss = ln.split('|', 1)
            f = head.split()
            pos = POS.get(f[2], f[2])
            n = int(f[3], 16)
            words = [f[4 + 2 * i].replace('_', ' ') for i in range(n)]
            words = [re.sub(r'\(.*\)$', '', w) for w in words]
            out.append(dict(words=words, pos=pos, gloss=gloss.strip()))
    return out


def extract(pkg, deb, roots):
    root = os.path.join(roots, pkg)
    if not os.path.isdir(root):
        subprocess.run(['dpkg-deb', '-x', deb, root], check=True)
    return root


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--packages', default=os.path.join(here, 'packages.txt'))
    ap.add_argument('--max-packages', type=int, default=0, help='the first N of the list (toy runs)')
    ap.add_argument('--data', default=os.path.join(here, '..', 'data'))
    ap.add_argument('--jobs', type=int, default=os.cpu_count() or 2)
    a = ap.parse_args()
    pkgs = read_list(a.packages)
    if a.max_packages:
        pkgs = pkgs[:a.max_packages]
    data = os.path.abspath(a.data)
    debs = download(pkgs, os.path.join(data, 'debs'))
    roots = os.path.join(data, 'root')
    os.makedirs(roots, exist_ok=True)
    os.makedirs(os.path.join(data, 'corpus'), exist_ok=True)
    ftrain = open(os.path.join(data, 'corpus', 'train.jsonl'), 'w')
    fheld = open(os.path.join(data, 'corpus', 'heldout.jsonl'), 'w')
    fman = open(os.path.join(data, 'corpus', 'manpages.jsonl'), 'w')
    fwn = open(os.path.join(data, 'corpus', 'wordnet.jsonl'), 'w')
    manifest = []
    stats = dict(docs=0, bytes=0, heldout_docs=0, heldout_bytes=0, manpages=0, readmes=0, glosses=0)

    def emit(src, pkg, text):
        held = heldout(src)
        (fheld if held else ftrain).write(json.dumps(dict(src=src, pkg=pkg, text=text), ensure_ascii=False) + '\n')
        k = 'heldout_' if held else ''
        stats[k + 'docs'] += 1
        stats[k + 'bytes'] += len(text.encode())
        return len(text.encode())

    for pkg in pkgs:
        if pkg not in debs:
            continue
        deb = debs[pkg]
        root = extract(pkg, deb, roots)
        nbytes = 0
        pages = []
        mandir = os.path.join(root, 'usr/share/man')
        secs = ('man1', 'man5', 'man7', 'man8') + (('man2', 'man3') if pkg == 'manpages-dev' else ())
        for sec in secs:
            d = os.path.join(mandir, sec)
            if os.path.isdir(d):
                pages += [os.path.join(d, f) for f in sorted(os.listdir(d))
                          if not os.path.islink(os.path.join(d, f))]
        with cf.ThreadPoolExecutor(a.jobs) as ex:
            texts = list(ex.map(render_man, pages))
        for p, text in zip(pages, texts):
            if not text:
                continue
            name = re.sub(r'\.(gz|xz|bz2)$', '', os.path.basename(p))
            nbytes += emit(f'man:{name}', pkg, text)
            stats['manpages'] += 1
            st = man_structure(name.rsplit('.', 1)[0], text)
            st.update(pkg=pkg, section=name.rsplit('.', 1)[-1], heldout=heldout(f'man:{name}'))
            fman.write(json.dumps(st, ensure_ascii=False) + '\n')
        for src, text in docs_of(root, pkg):
            nbytes += emit(f'doc:{src}', pkg, text)
            stats['readmes'] += 1
        if pkg == 'wordnet-base':
            entries = wordnet(root)
            # glosses go to the prose corpus in groups of 50 (one document), and to wordnet.jsonl
            for i in range(0, len(entries), 50):
                grp = entries[i:i + 50]
                text = '\n'.join(f'{", ".join(e["words"])} ({e["pos"]}): {e["gloss"]}' for e in grp)
                nbytes += emit(f'wordnet:{i}', pkg, text)
            for e in entries:
                e['heldout'] = heldout('word:' + e['words'][0])
                fwn.write(json.dumps(e, ensure_ascii=False) + '\n')
            stats['glosses'] += len(entries)
        manifest.append((pkg, deb_field(deb, 'Version'), license_of(root, pkg), nbytes))
    for f in (ftrain, fheld, fman, fwn):
        f.close()
    with open(os.path.join(data, 'manifest.tsv'), 'w') as f:
        f.write('package\tversion\tlicense\tcorpus_bytes\n')
        for row in manifest:
            f.write('\t'.join(map(str, row)) + '\n')
    stats['packages'] = len(manifest)
    print(json.dumps(stats))


if __name__ == '__main__':
    main()
