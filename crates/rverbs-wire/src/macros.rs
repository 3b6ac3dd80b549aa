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

/// Declares the getters and setters of a view's fields from a table of
/// `getter / setter : kind @ byte offset;` rows. Bit offsets follow the
/// IBTA's `Byte[Bit]` notation (bit 0 is the most significant). Kinds:
/// `u8`, `u16`, `u24` (a `u32`), `u32`, `u64`, `psn` (24 bits as a
/// [`Psn`](crate::Psn)), `bits[bit, width]` (a `u8`), `flag[bit]` (a `bool`),
/// `hi20` (the high 20 bits of a 32-bit word: a flow label) and `gid`
/// (16 bytes). Setters mask the value to the field's width and keep every bit
/// outside the field.
macro_rules! wire_fields {
    ($view:ident {
        $( $(#[$doc:meta])* $get:ident / $set:ident : $kind:ident $([$($arg:expr),+])? @ $at:expr; )*
    }) => {
        impl<T: AsRef<[u8]>> $view<T> {
            $(
                $(#[$doc])*
                pub fn $get(&self) -> $crate::macros::wire_fields!(@ty $kind) {
                    $crate::macros::wire_fields!(@get $kind, self.buffer.as_ref(), $at $(, $($arg),+)?)
                }
            )*
        }

        impl<T: AsRef<[u8]> + AsMut<[u8]>> $view<T> {
            $(
                #[doc = concat!("Sets the field [`", stringify!($get), "`](Self::", stringify!($get), ") reads.")]
                pub fn $set(&mut self, value: $crate::macros::wire_fields!(@ty $kind)) {
                    $crate::macros::wire_fields!(@set $kind, self.buffer.as_mut(), $at, value $(, $($arg),+)?)
                }
            )*
        }
    };

    (@ty u8) => { u8 };
    (@ty bits) => { u8 };
    (@ty flag) => { bool };
    (@ty u16) => { u16 };
    (@ty u24) => { u32 };
    (@ty psn) => { $crate::Psn };
    (@ty u32) => { u32 };
    (@ty hi20) => { u32 };
    (@ty u64) => { u64 };
    (@ty gid) => { [u8; 16] };

    (@get u8, $b:expr, $at:expr) => { $b[$at] };
    (@get bits, $b:expr, $at:expr, $bit:expr, $width:expr) => {
        $crate::bytes::get_bits($b[$at], $bit, $width)
    };
    (@get flag, $b:expr, $at:expr, $bit:expr) => {
        $crate::bytes::get_bits($b[$at], $bit, 1) != 0
    };
    (@get u16, $b:expr, $at:expr) => { $crate::bytes::get_u16($b, $at) };
    (@get u24, $b:expr, $at:expr) => { $crate::bytes::get_u24($b, $at) };
    (@get psn, $b:expr, $at:expr) => { $crate::Psn::new($crate::bytes::get_u24($b, $at)) };
    (@get u32, $b:expr, $at:expr) => { $crate::bytes::get_u32($b, $at) };
    (@get hi20, $b:expr, $at:expr) => { $crate::bytes::get_hi20($b, $at) };
    (@get u64, $b:expr, $at:expr) => { $crate::bytes::get_u64($b, $at) };
    (@get gid, $b:expr, $at:expr) => {{
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&$b[$at..$at + 16]);
        gid
    }};

    (@set u8, $b:expr, $at:expr, $v:expr) => { $b[$at] = $v };
    (@set bits, $b:expr, $at:expr, $v:expr, $bit:expr, $width:expr) => {
        $crate::bytes::set_bits($b, $at, $bit, $width, $v)
    };
    (@set flag, $b:expr, $at:expr, $v:expr, $bit:expr) => {
        $crate::bytes::set_bits($b, $at, $bit, 1, u8::from($v))
    };
    (@set u16, $b:expr, $at:expr, $v:expr) => { $crate::bytes::set_u16($b, $at, $v) };
    (@set u24, $b:expr, $at:expr, $v:expr) => {
        $crate::bytes::set_u24($b, $at, $v & 0x00ff_ffff)
    };
    (@set psn, $b:expr, $at:expr, $v:expr) => { $crate::bytes::set_u24($b, $at, $v.value()) };
    (@set u32, $b:expr, $at:expr, $v:expr) => { $crate::bytes::set_u32($b, $at, $v) };
    (@set hi20, $b:expr, $at:expr, $v:expr) => { $crate::bytes::set_hi20($b, $at, $v) };
    (@set u64, $b:expr, $at:expr, $v:expr) => { $crate::bytes::set_u64($b, $at, $v) };
    (@set gid, $b:expr, $at:expr, $v:expr) => { $b[$at..$at + 16].copy_from_slice(&$v) };
}

pub(crate) use wire_fields;

/// Declares byte areas of a view (private data, additional information):
/// `getter / getter_mut @ offset, length;` rows give a `&[u8]` and a
/// `&mut [u8]` accessor and a `…_LEN` constant per area.
macro_rules! wire_areas {
    ($view:ident {
        $( $(#[$doc:meta])* $get:ident / $get_mut:ident / $len:ident @ $at:expr, $n:expr; )*
    }) => {
        impl<T: AsRef<[u8]>> $view<T> {
            $(
                #[doc = concat!("Length of [`", stringify!($get), "`](Self::", stringify!($get), ") in bytes.")]
                pub const $len: usize = $n;

                $(#[$doc])*
                pub fn $get(&self) -> &[u8] {
                    &self.buffer.as_ref()[$at..$at + $n]
                }
            )*
        }

        impl<T: AsRef<[u8]> + AsMut<[u8]>> $view<T> {
            $(
                #[doc = concat!("The bytes of [`", stringify!($get), "`](Self::", stringify!($get), "), to write.")]
                pub fn $get_mut(&mut self) -> &mut [u8] {
                    &mut self.buffer.as_mut()[$at..$at + $n]
                }
            )*
        }
    };
}

pub(crate) use wire_areas;
