//! The `palisade` binary: parse the command line, set up logging, run.

use clap::Parser;
use palisade::app::{self, App};
use palisade::cli::{Cli, Command};
use palisade::store::Store;
use tracing_subscriber::EnvFilter;

/// mimalloc instead of glibc malloc: allocation-heavy request handling
/// (hyper, serde_json, sqlx) spent 14% of the server's CPU in malloc/free.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Serve(args) => {
            let app = App::build(args.into_config()).await?;
            app.run_until(app::shutdown_signal()).await
        }
        Command::Migrate(args) => {
            let store = Store::connect(&args.database_url).await?;
            tracing::info!(backend = store.backend_name(), "migrations applied");
            store.close().await;
            Ok(())
        }
        Command::Repack(args) => {
            let done = palisade::store::repack_sqlite(&args.database_url, args.page_size)?;
            let mib = |bytes: u64| bytes as f64 / (1 << 20) as f64;
            if done.changed() {
                println!(
                    "repacked {}: {}-byte pages -> {}-byte pages, {:.1} MiB -> {:.1} MiB",
                    done.path.display(),
                    done.before.page_size,
                    done.after.page_size,
                    mib(done.before.bytes()),
                    mib(done.after.bytes()),
                );
            } else {
                println!(
                    "{} already has {}-byte pages; left as it is",
                    done.path.display(),
                    done.after.page_size
                );
            }
            Ok(())
        }
        Command::Torture(args) => {
            if palisade::torture::run(args).await? {
                println!("torture: PASSED");
                Ok(())
            } else {
                println!("torture: FAILED");
                std::process::exit(1)
            }
        }
        Command::TortureWorker(args) => palisade::torture::worker::run(args).await,
        #[cfg(feature = "client")]
        Command::Client(command) => std::process::exit(palisade::commands::execute(command).await),
        Command::Bench(args) => palisade::bench::main(args).await,
    }
}
