#!/usr/bin/env python3
"""xd_wide_sim.py: the staged GEMV's input digits (src/cuda/idot.cuh) built
the byte way (xd_span: a lane two values, a span a warp) and the word way
(xd_build_wide: a lane 8 values, a span 8 lanes), simulated in float32 on the
host, the same operations in the same order, and compared byte for byte
(digits) and bit for bit (each chunk's dx and sum), at q4 and q8, for 512
and 2,048 inputs. It checks the layout and the sums' order of the word form
before the GPU runs it; the op checks' q4 and q8 GEMV cases (make
test-cuda) are the test. Needs numpy. Exit status 1 on any difference."""
import sys

import numpy as np
f32=np.float32
def prep(span):
    """A span's max |x|, 2^20 / max and max / 2^20, as xd_span makes them."""
    m=np.max(np.abs(span)).astype(f32)
    inv=f32(1048576.0)/m if m>0 else f32(0)
    dx=m*f32(1.0/1048576.0) if m>0 else f32(0)
    return m,inv,dx
def digits(v):
    """The three 7-bit digits of an integer (the last signed)."""
    return [v & 127, (v>>7)&127, v>>14]
def byte_form(x, kind):
    """xd_span over every span: lane l of a warp holds values 2l, 2l + 1."""
    E=32 if kind=='q4' else 16; LPC=E//2
    cols=len(x); nsp=cols//64; nch=cols//E
    xb=np.zeros(6*nch*16, dtype=np.uint8)   # XD_VEC4 = 6 uint4 a chunk
    cx={}
    for sp in range(nsp):
        span=x[sp*64:(sp+1)*64]
        m,inv,dx=prep(span)
        s=[f32(span[2*l]+span[2*l+1]) for l in range(32)]
        o=LPC//2
        while o:
            s=[f32(s[l]+s[l^o]) for l in range(32)]
            o//=2
        for lane in range(32):
            ci=sp*(64//E)+lane//LPC; e=(2*lane)%E
            xi=[int(np.rint(f32(span[2*lane]*inv))), int(np.rint(f32(span[2*lane+1]*inv)))]
            for h in range(2):
                dg=digits(xi[h])
                w=(e>>3) if kind=='q4' else (e+h)>>2
                b=((e&7)>>1) if kind=='q4' else (e+h)&3
                for d in range(3):
                    f=(w*2+h)*3+d if kind=='q4' else w*3+d
                    xb[((f>>2)*nch+ci)*16+(f&3)*4+b]=dg[d]&0xff
            if lane%LPC==0: cx[ci]=(dx,s[lane])
    return xb,cx
def wide_form(x, kind):
    """xd_build_wide: lane k of a span's 8 holds values 8k .. 8k + 7."""
    E=32 if kind=='q4' else 16
    cols=len(x); nsp=cols//64; nch=cols//E
    xw=np.zeros(6*nch*4, dtype=np.uint32)
    cx={}
    for sp in range(nsp):
        span=x[sp*64:(sp+1)*64]
        m,inv,dx=prep(span)
        P=[[f32(span[8*k+2*j]+span[8*k+2*j+1]) for j in range(4)] for k in range(8)]
        if kind=='q4':
            P=[[f32(P[k][j]+P[k^2][j]) for j in range(4)] for k in range(8)]
            P=[[f32(P[k][j]+P[k^1][j]) for j in range(4)] for k in range(8)]
        else:
            P=[[f32(P[k][j]+P[k^1][j]) for j in range(4)] for k in range(8)]
        S=[f32(f32(P[k][0]+P[k][2])+f32(P[k][1]+P[k][3])) for k in range(8)]
        for k in range(8):
            xi=[int(np.rint(f32(span[8*k+i]*inv))) for i in range(8)]
            def pack(i0,step,d):
                w=0
                for b in range(4):
                    w|=(digits(xi[i0+step*b])[d]&0xff)<<(8*b)
                return w
            if kind=='q4':
                ci=sp*2+(k>>2); w=k&3
                for h in range(2):
                    for d in range(3):
                        f=(w*2+h)*3+d
                        xw[((f>>2)*nch+ci)*4+(f&3)]=pack(h,2,d)
                if (k&3)==0: cx[ci]=(dx,S[k])
            else:
                ci=sp*4+(k>>1)
                for wl in range(2):
                    for d in range(3):
                        f=(2*(k&1)+wl)*3+d
                        xw[((f>>2)*nch+ci)*4+(f&3)]=pack(4*wl,1,d)
                if (k&1)==0: cx[ci]=(dx,S[k])
    return xw.view(np.uint8),cx
rng=np.random.default_rng(1)
bad=0
for kind in ['q4','q8']:
    for cols in [512,2048]:
        for t in range(3):
            x=(rng.standard_normal(cols)*rng.uniform(0.01,10)).astype(f32)
            if t==2: x[:64]=0; x[100]=-x[100]*1000
            a,ca=byte_form(x,kind); b,cb=wide_form(x,kind)
            eq=np.array_equal(a,b)
            ceq=all(ca[c][0].tobytes()==cb[c][0].tobytes() and ca[c][1].tobytes()==cb[c][1].tobytes() for c in ca) and ca.keys()==cb.keys()
            print(kind,cols,t,'digits equal',eq,'chunks equal',ceq)
            bad+=not (eq and ceq)
sys.exit(1 if bad else 0)
