// nn/data/token_file.h: files of token ids, as llm.c and nanoGPT store what a tokenizer made of a
// text, read and written. Not here: the batches drawn from the ids (nn/data/data.h).
//
// The formats:
//  - llm.c's (dev/data/data_common.py, write_datafile): a header of 256 little-endian int32, [0] a
//    magic number, [1] a version, [2] the number of ids N (the rest zeros), then the N ids: magic
//    20240520 with version 1 for uint16 ids (GPT-2's files, vocabularies up to 65,536), magic
//    20240801 with version 7 for uint32 ids (Llama 3's).
//  - raw (nanoGPT's data/*/prepare.py: numpy's uint16 array written with tofile): the uint16 ids
//    alone, no header.
// Every integer is little-endian on disk, as numpy writes them on x86 and Arm.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/check.h"

namespace normtape {

enum class TokenFileFormat {
    Auto,  // llm.c's where the file starts with one of its magic numbers, else raw
    LlmC,
    Raw,
};

// "auto", "llm.c", "raw".
const char* token_file_format_name(TokenFileFormat format);

// The ids of the token file `path`, in order, as uint32. With Auto, a file whose first 4 bytes are
// one of llm.c's magic numbers is read as llm.c's and any other as raw; `detected`, when given, is
// set to the format read. Reads the whole file into memory (4 bytes an id). Throws IOError naming
// the file and the system's reason when it cannot be opened or read (a directory among them);
// FormatError naming the file, what was expected and what was found when it is not in the format:
// an llm.c header shorter than 1,024 bytes, a magic number that is not llm.c's (LlmC), a version
// that is not its magic's, a token count below 1 or other than the ids the file's size holds; a
// raw file of an odd size or none.
std::vector<uint32_t> read_token_file(const std::string& path, TokenFileFormat format = TokenFileFormat::Auto,
                                      TokenFileFormat* detected = nullptr);
// The same from a token file's bytes (`name` names it in messages); throws FormatError only.
std::vector<uint32_t> parse_token_file(std::string_view bytes, const std::string& name,
                                       TokenFileFormat format = TokenFileFormat::Auto,
                                       TokenFileFormat* detected = nullptr);

// Writes `ids` to `path` in llm.c's format, replacing the file: uint16 ids (magic 20240520,
// version 1) when every id is below 65,536, else uint32 (20240801, version 7). Throws Error when
// `ids` is empty or holds 2^31 ids or more (the header's int32 count), IOError naming the file and
// the system's reason when it cannot be written.
void write_token_file(const std::string& path, const std::vector<uint32_t>& ids);

}  // namespace normtape
