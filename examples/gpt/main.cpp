// build/bin/gpt: train GPT-mini with FSDP (gpt.cpp: the flags; train.cpp: the run).
#include "gpt/train.h"

int main(int argc, char** argv) { return gpt::run(argc, argv); }
