//! The boilerplate every fixed-size header view shares.

/// Declares `$name<T: AsRef<[u8]>>`, a view over a buffer holding a
/// `$len`-byte header, with `new_unchecked`, `new_checked`, `check_len`,
/// `into_inner` and `as_bytes`.
macro_rules! header_view {
    ($(#[$doc:meta])* $name:ident, $len:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct $name<T: AsRef<[u8]>> {
            buffer: T,
        }

        impl<T: AsRef<[u8]>> $name<T> {
            /// Length of the header in bytes.
            pub const LEN: usize = $len;

            /// Wraps a buffer without checking its length; getters and
            /// setters then panic if it is shorter than [`Self::LEN`].
            pub const fn new_unchecked(buffer: T) -> Self {
                $name { buffer }
            }

            /// Wraps a buffer after checking it holds the whole header.
            pub fn new_checked(buffer: T) -> $crate::Result<Self> {
                let view = Self::new_unchecked(buffer);
                view.check_len()?;
                Ok(view)
            }

            /// Fails with [`Error::Truncated`](crate::Error::Truncated) if
            /// the buffer is shorter than the header.
            pub fn check_len(&self) -> $crate::Result<()> {
                let got = self.buffer.as_ref().len();
                if got < Self::LEN {
                    Err($crate::Error::Truncated { needed: Self::LEN, got })
                } else {
                    Ok(())
                }
            }

            /// The underlying buffer.
            pub fn into_inner(self) -> T {
                self.buffer
            }

            /// The header's bytes.
            pub fn as_bytes(&self) -> &[u8] {
                &self.buffer.as_ref()[..Self::LEN]
            }
        }
    };
}

pub(crate) use header_view;
