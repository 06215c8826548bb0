// `computron console`: its flags, then the operator's prompt (console.cpp).
#include <memory>

#include <CLI/CLI.hpp>

#include "apps/computron/command.hpp"
#include "apps/computron/console.hpp"

namespace computron::app {

namespace {

const registration console_command{
    {"console", "attach to a running controller (serve) and run commands; `help` lists them", 50,
     [](CLI::App& cmd) -> command_run {
       auto o = std::make_shared<console_options>();
       cmd.add_option("--connect", o->connect, "the controller's console port")
           ->capture_default_str();
       cmd.add_option("-c,--commands", o->commands,
                      "run these commands (separated by ';') and exit");
       add_tls_flags(cmd, o->tls);
       return [o] { return run_console(*o); };
     }}};

}  // namespace

}  // namespace computron::app
