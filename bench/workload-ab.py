#!/usr/bin/env python3
# bench/workload-ab.py POINT CAND... -- paired, interleaved A/B of `faultline workload` builds
# (and fio) at one QD1 point of bench/workload.sh, on a private loop device over /dev/shm
# (--direct-io=on, as the ceiling loop). POINT: w128k | w4k | rr4k. CAND: `fio`, or
# NAME=BINARY[:VAR~VALUE...] (environment for that run). Each round runs every candidate once,
# the order rotating by round; per round IOPS / CPU us per I/O (user+system of the process,
# wait4 rusage). Prints medians and, with fio, the per-round ratios' medians.
# Env: ROUNDS (5), SECS (2).
import os, sys, json, shutil, subprocess, statistics, tempfile
img = f'/dev/shm/faultline-wlab-{os.getpid()}.img'
with open(img, 'wb') as f:
    f.truncate(1 << 30)
dev = subprocess.run(['losetup', '-f', '--show', '--direct-io=on', img], check=True, capture_output=True, text=True).stdout.strip()
secs = os.environ.get('SECS', '2'); rounds = int(os.environ.get('ROUNDS', '5'))
point = sys.argv[1]  # e.g. w128k
cands = sys.argv[2:]  # "fio" or "name=binary[:ENV=V]"
P = {'w128k': ('--rw=write --bs=128k --ioengine=psync', '--pattern sequential --write-pct 100 --bs 128KiB --engine psync'),
     'w4k': ('--rw=write --bs=4k --ioengine=psync', '--pattern sequential --write-pct 100 --bs 4KiB --engine psync'),
     'rr4k': ('--rw=randread --bs=4k --ioengine=psync', '--pattern uniform --write-pct 0 --bs 4KiB --engine psync')}
fa, la = P[point]
tmp = tempfile.mkdtemp()
def run(cmd, env, out):
    pid = os.fork()
    if pid == 0:
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC); os.dup2(fd, 1); os.dup2(fd, 2)
        os.execvpe(cmd[0], cmd, env)
    _, st, ru = os.wait4(pid, 0)
    assert st == 0, cmd
    return ru.ru_utime + ru.ru_stime
try:
    res = {c: [] for c in cands}
    for r in range(rounds):
        order = cands[r % len(cands):] + cands[:r % len(cands)]
        for c in order:
            env = dict(os.environ)
            if c == 'fio':
                cpu = run(['fio', '--name=p', f'--filename={dev}', '--direct=1', '--size=512M', f'--runtime={secs}', '--time_based', '--output-format=json', f'--output={tmp}/f.json'] + fa.split(), env, tmp + '/o')
                j = json.load(open(tmp + '/f.json'))['jobs'][0]; iops = j['read']['iops'] + j['write']['iops']; ios = j['read']['total_ios'] + j['write']['total_ios']
            else:
                name, spec = c.split('=', 1)
                b, *ev = spec.split(':')
                for e in ev: k, v = e.split('~'); env[k] = v
                cpu = run([b, 'workload', '--device', dev, '--span', '512MiB', '--duration', secs + 's', '--out', tmp + '/fl'] + la.split(), env, tmp + '/o')
                j = json.load(open(tmp + '/fl/result.json')); iops = j['read']['iops'] + j['write']['iops']; ios = j['read']['ops'] + j['write']['ops']
            res[c].append((iops, cpu / ios * 1e6))
        print('round', r, ' '.join(f'{c.split("=")[0]}:{res[c][-1][0]:.0f}/{res[c][-1][1]:.2f}' for c in cands), flush=True)
    for c in cands:
        v = res[c]
        print(f'{c.split("=")[0]:10} median IOPS {statistics.median(x[0] for x in v):9.0f}  median us/IO {statistics.median(x[1] for x in v):6.2f}  best IOPS {max(x[0] for x in v):9.0f} best us/IO {min(x[1] for x in v):6.2f}')
    if 'fio' in cands:
        f = res['fio']
        for c in cands:
            if c == 'fio': continue
            ri = [a[0] / b[0] for a, b in zip(res[c], f)]; rc = [a[1] / b[1] for a, b in zip(res[c], f)]
            print(f'{c.split("=")[0]:10} per-round ratio vs fio: IOPS median {statistics.median(ri):.3f}  CPU/IO median {statistics.median(rc):.3f}')
finally:
    subprocess.run(['losetup', '-d', dev])
    os.remove(img)
    shutil.rmtree(tmp, ignore_errors=True)
