//! Macros shared by the op files.

/// Runs the CPU kernel on host copies of the tensor arguments and uploads the result.
macro_rules! fallback {
    ($self:ident, $kernel:path; [$($t:ident),*] $(, $arg:expr)*) => {{
        $self.ctx.note_fallback(stringify!($kernel));
        $(let $t = $self.to_host($t)?;)*
        $kernel($self.cpu(), $(&$t,)* $($arg),*)?.to_backend($self)
    }};
}
