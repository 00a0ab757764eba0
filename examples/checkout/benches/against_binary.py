"""The checkout binary under its built-in load, measured from outside: requests per
second (its own `load done` line), latencies of GET /health and of the viewer's
api/traces (a prober every 50 ms), alone and with 4 clients asking the differential
flamegraph of the slowest checkout in a loop (from 3 s into the load).

    python3 examples/checkout/benches/against_binary.py BINARY [--viewer-on-api]

--viewer-on-api: a binary from before `--viewer` existed (the viewer on the API port),
such as one built from commit c8d6456.
"""
import json
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request

def get(url, timeout=30):
    t=time.time()
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r: r.read(); code=r.status
    except Exception as e: code=getattr(e,'code',0)
    return code, time.time()-t
def run(binary, new, diff_clients, secs=20):
    args=[binary,'--listen','127.0.0.1:0','--load',f'{secs}s']
    if new: args+=['--viewer','127.0.0.1:0']
    p=subprocess.Popen(args,stdout=subprocess.PIPE,stderr=subprocess.DEVNULL,text=True)
    lines=[]
    def reader():
        for l in p.stdout: lines.append(l)
    threading.Thread(target=reader,daemon=True).start()
    while not any(l.startswith('checkout API') for l in lines): time.sleep(0.05)
    api=re.search(r'http://(\S+)',[l for l in lines if l.startswith('checkout API')][0]).group(1)
    if new:
        while not any(l.startswith('viewer') for l in lines): time.sleep(0.05)
        base=re.search(r'(http://\S+)',[l for l in lines if l.startswith('viewer')][0]).group(1)
    else:
        base=f'http://{api}/debug/spanprof/'
    stop=[False]; health=[]; viewer=[]; diffs=[]
    def prober():
        while not stop[0]:
            c,t=get(f'http://{api}/health'); health.append(t)
            c,t=get(base+'api/traces?limit=20'); viewer.append(t)
            time.sleep(0.05)
    threading.Thread(target=prober,daemon=True).start()
    threads=[]
    if diff_clients:
        time.sleep(3)
        with urllib.request.urlopen(base+'api/traces?route=POST%20/checkout&limit=1',timeout=60) as r:
            sid=json.loads(r.read())[0]['root_span_id']
        def differ():
            while not stop[0]:
                c,t=get(base+f'diff/{sid}?minutes=5',timeout=60)
                if c==200: diffs.append(t)
        for _ in range(4):
            th=threading.Thread(target=differ,daemon=True); th.start(); threads.append(th)
    while not any(l.startswith('load done') for l in lines):
        if p.poll() is not None: break
        time.sleep(0.1)
    stop[0]=True
    done=[l for l in lines if l.startswith('load done')][0]
    p.send_signal(signal.SIGINT)
    try: p.wait(timeout=20)
    except: p.kill()
    req=int(re.search(r'(\d+) requests',done).group(1))
    def pct(v,q):
        v=sorted(v); return v[min(len(v)-1,int(len(v)*q))]*1e3 if v else 0
    return dict(requests_per_s=req/secs, health_ms=(round(pct(health,.5),1),round(pct(health,.99),1),round(max(health)*1e3,1)), viewer_ms=(round(pct(viewer,.5),1),round(pct(viewer,.99),1),round(max(viewer)*1e3,1)), diffs=len(diffs), diff_p50_ms=round(pct(diffs,.5),1))
binary=sys.argv[1]
new='--viewer-on-api' not in sys.argv
for d in (False,True):
    r=run(binary, new, d)
    print('with 4 diff clients' if d else 'alone', json.dumps(r), flush=True)
