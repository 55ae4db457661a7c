
:
xPlaceholder*
dtype0*
shape:
:
fPlaceholder*
dtype0*
shape:
S
convConv2Dxf*
strides
*
data_formatNHWC*
paddingSAME
;
dyPlaceholder*
dtype0*
shape:
8
x_sizesConst*
dtype0*
valueB:
8
f_sizesConst*
dtype0*
valueB:
h
dxConv2DBackpropInputx_sizesfdy*
strides
*
data_formatNHWC*
paddingSAME
i
dfConv2DBackpropFilterxf_sizesdy*
strides
*
data_formatNHWC*
paddingSAME
N
poolMaxPoolx*
strides
*
paddingVALID*
ksize

>
dpoolPlaceholder*
dtype0*
shape:
a
dxpoolMaxPoolGradxpooldpool*
strides
*
paddingVALID*
ksize
