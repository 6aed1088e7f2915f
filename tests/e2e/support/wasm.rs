//! Hostile components for the upload tests, written byte by byte: valid WebAssembly that is
//! costly to compile. A component here is one core module in a component wrapper; it exports
//! nothing, so it would be refused after compiling — the point is what compiling it costs.

fn leb(mut n: u64, out: &mut Vec<u8>) {
    loop {
        let byte = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

fn sleb(mut n: i64, out: &mut Vec<u8>) {
    loop {
        let byte = (n & 0x7f) as u8;
        n >>= 7;
        let done = (n == 0 && byte & 0x40 == 0) || (n == -1 && byte & 0x40 != 0);
        if done {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

fn section(id: u8, payload: &[u8], out: &mut Vec<u8>) {
    out.push(id);
    leb(payload.len() as u64, out);
    out.extend_from_slice(payload);
}

/// `bytes` (a component or module) with a custom section `name` holding `payload` appended:
/// the same code, another digest.
pub fn with_custom_section(mut bytes: Vec<u8>, name: &[u8], payload: &[u8]) -> Vec<u8> {
    let mut content = Vec::new();
    leb(name.len() as u64, &mut content);
    content.extend_from_slice(name);
    content.extend_from_slice(payload);
    section(0, &content, &mut bytes);
    bytes
}

/// `functions` copies of a function `(i64) -> i64` with `locals` i64 locals, each set from the
/// parameter, then `ops` random `local.get a; local.get b; i64.add; local.set c`, returning the
/// sum of all locals (so that nothing can be folded away).
pub fn component(functions: usize, locals: u32, ops: usize) -> Vec<u8> {
    let mut body = Vec::new();
    body.push(1); // one local group
    leb(u64::from(locals), &mut body);
    body.push(0x7e);
    for i in 1..=locals {
        body.push(0x20);
        leb(0, &mut body);
        body.push(0x42);
        sleb(i64::from(i) * 7919, &mut body);
        body.push(0x7e); // i64.mul
        body.push(0x21);
        leb(u64::from(i), &mut body);
    }
    let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = |bound: u32| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % u64::from(bound)) as u32
    };
    for _ in 0..ops {
        let (a, b, c) = (next(locals + 1), next(locals + 1), 1 + next(locals));
        body.push(0x20);
        leb(u64::from(a), &mut body);
        body.push(0x20);
        leb(u64::from(b), &mut body);
        body.push(0x7c); // i64.add
        body.push(0x21);
        leb(u64::from(c), &mut body);
    }
    for i in 0..=locals {
        body.push(0x20);
        leb(u64::from(i), &mut body);
        if i > 0 {
            body.push(0x7c);
        }
    }
    body.push(0x0b);

    let mut core = b"\0asm\x01\0\0\0".to_vec();
    // type 0: (i64) -> i64
    section(1, &[1, 0x60, 1, 0x7e, 1, 0x7e], &mut core);
    let mut funcs = Vec::new();
    leb(functions as u64, &mut funcs);
    funcs.extend(std::iter::repeat_n(0u8, functions));
    section(3, &funcs, &mut core);
    let mut code = Vec::new();
    leb(functions as u64, &mut code);
    for _ in 0..functions {
        leb(body.len() as u64, &mut code);
        code.extend_from_slice(&body);
    }
    section(10, &code, &mut core);

    let mut component = b"\0asm\x0d\0\x01\0".to_vec();
    section(1, &core, &mut component);
    component
}

/// About 1.3 MB that the compiler works on for minutes (register allocation over 20,000 live
/// values).
pub fn slow_to_compile() -> Vec<u8> {
    component(1, 20_000, 100_000)
}

/// Many tiny functions: compiling takes several KiB of memory per function (60,000 functions,
/// about 1.4 MB, need about 400 MiB).
pub fn memory_hungry() -> Vec<u8> {
    component(60_000, 1, 1)
}
