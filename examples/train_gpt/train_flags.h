// examples/train_gpt/train_flags.h: train_gpt's command line: the flags that fill Args (CLI11, with the
// syntax of each value checked before conversion) and --preset. Not here: the checks of the values
// themselves (examples/train_gpt/train_args.h).
#pragma once

#include "train_args.h"

namespace CLI {
class App;
}

// Adds every train_gpt flag to `app`, each writing its field of `a` (whose initial values are the
// defaults --help shows).
void add_flags(CLI::App& app, Args& a);

// Fills in what --preset sets and the flags given on the command line left out (flags win).
void apply_preset(const CLI::App& app, Args& a);
