//! Standard output and error for the commands, without the panic of `println!` when the
//! reader has gone (`sparkform plan --json | head`): what is left to print is dropped, the work
//! goes on, and the exit code is the command's.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

static STDOUT_GONE: AtomicBool = AtomicBool::new(false);
static STDERR_GONE: AtomicBool = AtomicBool::new(false);

pub fn stdout(args: std::fmt::Arguments<'_>) {
    write(&mut std::io::stdout().lock(), &STDOUT_GONE, args);
}

pub fn stderr(args: std::fmt::Arguments<'_>) {
    write(&mut std::io::stderr().lock(), &STDERR_GONE, args);
}

fn write(w: &mut dyn Write, gone: &AtomicBool, args: std::fmt::Arguments<'_>) {
    if gone.load(Ordering::Relaxed) {
        return;
    }
    // A closed pipe (or a full disk behind a redirection) is not the command's failure; a
    // second message into it would fail the same way.
    if w.write_fmt(args).and_then(|()| w.flush()).is_err() {
        gone.store(true, Ordering::Relaxed);
    }
}
