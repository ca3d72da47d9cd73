//! Macros shared by the op files.

/// The CPU fallback of a native op, for inputs its kernel does not take: counts the
/// fallback, then runs the trait's one fallback path, [`fusebox::on_cpu!`] (host
/// copies of the tensor arguments, the CPU kernel, the result uploaded).
macro_rules! fallback {
    ($self:ident, $kernel:path; [$($t:ident),*] $(, $arg:expr)*) => {{
        $self.ctx.note_fallback(stringify!($kernel));
        fusebox::on_cpu!($self, $kernel; [$($t),*] $(, $arg)*)
    }};
}
