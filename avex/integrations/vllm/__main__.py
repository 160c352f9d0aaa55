from avex.integrations.vllm import _main

_main()
