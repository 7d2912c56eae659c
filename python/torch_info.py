"""Writes what the build needs to know about the installed PyTorch as a CMake file."""
import os
import sys

import torch
import torch.utils.cpp_extension as ext


def cmake_list(items):
    return ";".join(str(i).replace("\\", "/") for i in items)


with open(sys.argv[1], "w") as out:
    out.write('set(THDCP_TORCH_INCLUDES "%s")\n' % cmake_list(ext.include_paths()))
    out.write('set(THDCP_TORCH_LIBDIR "%s")\n' % os.path.join(os.path.dirname(torch.__file__), "lib"))
    out.write("set(THDCP_TORCH_CXX11_ABI %d)\n" % int(torch._C._GLIBCXX_USE_CXX11_ABI))
    out.write('set(THDCP_TORCH_CUDA "%s")\n' % (torch.version.cuda or ""))
    out.write('set(THDCP_TORCH_VERSION "%s")\n' % torch.__version__)
