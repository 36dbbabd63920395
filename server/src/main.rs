use std::process::ExitCode;

use clap::Parser;
use server::cli::{Cli, Command};
use server::Role;

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(Command::Extract { doc_type, run_as }) = &cli.command {
        // The sandboxed document reader: no logging, no runtime, nothing but the document.
        return engine::documents::ocr::reader_main(Some(doc_type), run_as.as_deref());
    }
    let role = match &cli.command {
        None | Some(Command::Serve) => "all",
        Some(Command::Web) => "web",
        Some(Command::Worker) => "worker",
        Some(_) => "operator",
    };
    let traces = match server::telemetry::init_tracing(
        &cli.config.telemetry.log,
        cli.config.telemetry.log_format,
        cli.config.telemetry.otlp_endpoint.as_deref(),
        role,
    ) {
        Ok(traces) => traces,
        Err(e) => {
            eprintln!("Error: {e:?}");
            return ExitCode::FAILURE;
        }
    };
    let outcome = run(cli);
    traces.flush();
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("Error: {e:?}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async {
        match cli.command.unwrap_or(Command::Serve) {
            Command::Serve => server::Application::build(&cli.config, Role::All).await?.run_until_stopped().await,
            Command::Web => server::Application::build(&cli.config, Role::Web).await?.run_until_stopped().await,
            Command::Worker => server::Application::build(&cli.config, Role::Worker).await?.run_until_stopped().await,
            operator => server::operator::run(cli.config, operator).await,
        }
    })
}
