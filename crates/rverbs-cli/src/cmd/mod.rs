//! One module per subcommand.

pub mod devinfo;
