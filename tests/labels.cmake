# tests/labels.cmake: ctest labels for the test cases that doctest_discover_tests found (ctest
# includes this file after doctest's list, which names them in normtape_tests_TESTS).
# slow: a test case that takes more than about 5 s on 2 cores without a GPU: training on real
# text, the PyTorch cross-check, and the test cases that run train_gpt. `ctest -LE slow`
# (scripts/test.sh --fast) runs the others. A new slow test case gets a line here.
set(normtape_slow_tests
  "^gpt: the loss falls when training on tinyshakespeare$"
  "^torch_crosscheck: "
  "^muon: three steps match KellerJordan/Muon's algorithm in PyTorch"
  "^train_gpt: "
  "^checkpoint: train_gpt "
  "^distributed: train_gpt "
  "^distributed: a checkpoint of 2 ranks "
  "^train_tokenizer: ")
foreach(test IN LISTS normtape_tests_TESTS)
  foreach(pattern IN LISTS normtape_slow_tests)
    if(test MATCHES "${pattern}")
      set_tests_properties("${test}" PROPERTIES LABELS slow)
    endif()
  endforeach()
endforeach()
